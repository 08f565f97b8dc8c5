#!/usr/bin/env bash
# Evaluate one training run of the paper's benchmarks: checkpoint (or the average of the last N),
# fairseq-generate with the benchmark's beam settings, BLEU the way the benchmark's literature
# reports it (scripts/score_bleu.py), results as JSON. Run with --help for the options.
set -euo pipefail

NAME=evaluate
LOG_TO_STDERR=1  # stdout is not used for data, but the log always went to stderr here
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # SCRIPT_DIR, REPO, log, die, need_value, tools
USER_DIR="${FAIRSEQ_RESIDUAL_USER_DIR:-}"

BENCHMARK=""
RUN_DIR=""
DATA=""
CHECKPOINT=""
AVERAGE=""
SUBSET=test
BEAM=""
LENPEN=""
MAX_LEN_A=1.2
MAX_LEN_B=10
BATCH_SIZE=128
RAW_REF=""
RAW_DIR=""
NEWSTEST_AVERAGE=0
NEWSTEST_REFS=""
DIRECTIONS=""
SRC_OPT=""
TGT_OPT=""
CPU=()
OUT=""
EXTRA=()

usage() {
    cat <<'EOF'
Usage: scripts/evaluate.sh --benchmark {iwslt14,wmt14,opus100} --run-dir DIR --data DIR [options]

  1. picks the checkpoint: --checkpoint, or the average of the run's last --average N checkpoints
     (scripts/average_checkpoints.py; epoch checkpoints when there are N, else update ones);
  2. translates the test set with fairseq-generate (--required-batch-size-multiple 1, so no
     sentence is dropped), writing RUN_DIR/eval/generate-SUBSET[.SRC-TGT].txt;
  3. scores it with scripts/score_bleu.py and writes RUN_DIR/eval/SUBSET.json:
       iwslt14  tokenized lowercased BLEU (fairseq-generate --remove-bpe output vs the tokenized
                references, sacreBLEU --tokenize none --lowercase)
       wmt14    tokenized BLEU with compound splitting (##AT##-##AT##, as fairseq's
                compound_split_bleu.sh) AND detokenized sacreBLEU (sacremoses detok vs the raw
                newstest2014 reference), each labelled, with its signature; with
                --newstest-average also sacreBLEU per newstest2010..2016 and their mean
       opus100  sacreBLEU per direction vs the raw OPUS-100 references, and the averages over
                en->xx and xx->en

Options:
  --benchmark B        iwslt14, wmt14 or opus100
  --run-dir DIR        the run's checkpoint directory (SAVE_ROOT/<benchmark>/<scheme>-<N>L-seed<K>)
  --data DIR           the binarized data the run was trained on
  --checkpoint C       best, last or a checkpoint file of this run, whose scheme and depth --run-dir's
                       name must match (default: best for iwslt14 -- the authors
                       select by validation BLEU --, last for opus100; wmt14 averages)
  --average N          average the last N checkpoints instead (default: 10 for wmt14, the
                       authors' keep_last_epochs; 0 = off)
  --subset S           test split (default: test)
  --beam N             beam size (default: 5 for iwslt14, 4 for wmt14 and opus100)
  --lenpen X           length penalty (default: 1.0 for iwslt14, 0.6 for wmt14 and opus100)
  --max-len-a A        --max-len-b B: max length A*src+B (default: 1.2 and 10, the authors'
                       validation setting)
  --batch-size N       sentences per batch (default: 128)
  --raw-ref FILE       wmt14: raw (detokenized) reference (default: DATA/../raw/newstest2014.de;
                       newstest2013.de for --subset test1)
  --newstest-average   wmt14: also the B2T protocol (github.com/takase/b2t_connection): decode
                       each of newstest2010..2016 separately with beam 4 and length penalty 0.6
                       for newstest2014, 1.0 for the other years (whatever --beam / --lenpen say),
                       Moses-detokenize, sacreBLEU against each year's raw reference; stores the
                       per-year scores (newstest_per_year) and their unweighted mean
                       (metric sacrebleu_newstest2010_2016_avg, then the primary metric) beside
                       the two newstest2014 scores. Needs the splits newstestYYYY of
                       scripts/prepare-wmt14-en-de.sh --newstest-years 2010-2016 (2014: test)
  --newstest-refs DIR  with --newstest-average: folder of the raw references newstestYYYY.de
                       (default: DATA/../raw, where the prepare script writes them), or
                       'sacrebleu' for sacreBLEU's own test sets (needs the network unless cached)
  --raw-dir DIR        opus100: folder with the raw SUBSET.en-xx.{en,xx} text (default: DATA/../raw)
  --directions LIST    opus100: comma-separated SRC-TGT directions (default: every pair in
                       DATA/lang_pairs.txt whose test data exists)
  --source-lang L      --target-lang L: iwslt14 / wmt14 languages (default: de-en for iwslt14,
                       en-de for wmt14)
  --cpu                generate on CPU
  --out FILE           result JSON (default: RUN_DIR/eval/SUBSET.json); with --out the translations go
                       beside it, FILE without .json + .generate-SUBSET.txt
  --extra "ARGS"       more fairseq-generate arguments (space separated; may be repeated)
  -h, --help           show this help

Beam search settings: the ResiDual paper does not state its test-time beam or length penalty;
the defaults follow each benchmark's usual fairseq recipe (IWSLT14: beam 5; WMT14: beam 4,
lenpen 0.6 as in Vaswani et al. / Ott et al. 2018; OPUS-100: beam 4, lenpen 0.6 as in Zhang et
al. 2020). They are stored in the JSON.
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --benchmark) need_value "$@"; BENCHMARK="$2"; shift 2 ;;
        --run-dir) need_value "$@"; RUN_DIR="$2"; shift 2 ;;
        --data) need_value "$@"; DATA="$2"; shift 2 ;;
        --checkpoint) need_value "$@"; CHECKPOINT="$2"; shift 2 ;;
        --average) need_value "$@"; AVERAGE="$2"; shift 2 ;;
        --subset) need_value "$@"; SUBSET="$2"; shift 2 ;;
        --beam) need_value "$@"; BEAM="$2"; shift 2 ;;
        --lenpen) need_value "$@"; LENPEN="$2"; shift 2 ;;
        --max-len-a) need_value "$@"; MAX_LEN_A="$2"; shift 2 ;;
        --max-len-b) need_value "$@"; MAX_LEN_B="$2"; shift 2 ;;
        --batch-size) need_value "$@"; BATCH_SIZE="$2"; shift 2 ;;
        --raw-ref) need_value "$@"; RAW_REF="$2"; shift 2 ;;
        --raw-dir) need_value "$@"; RAW_DIR="$2"; shift 2 ;;
        --newstest-average) NEWSTEST_AVERAGE=1; shift ;;
        --newstest-refs) need_value "$@"; NEWSTEST_REFS="$2"; shift 2 ;;
        --directions) need_value "$@"; DIRECTIONS="$2"; shift 2 ;;
        --source-lang) need_value "$@"; SRC_OPT="$2"; shift 2 ;;
        --target-lang) need_value "$@"; TGT_OPT="$2"; shift 2 ;;
        --cpu) CPU=(--cpu); shift ;;
        --out) need_value "$@"; OUT="$2"; shift 2 ;;
        --extra) [[ $# -ge 2 ]] || die "option --extra needs a value"
                 read -r -a words <<< "$2"; EXTRA+=("${words[@]}"); shift 2 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

case "$BENCHMARK" in
    iwslt14) D_BEAM=5; D_LENPEN=1.0; D_CKPT=best; D_AVG=0; REMOVE_BPE=(--remove-bpe) ;;
    wmt14)   D_BEAM=4; D_LENPEN=0.6; D_CKPT=last; D_AVG=10; REMOVE_BPE=(--remove-bpe) ;;
    opus100) D_BEAM=4; D_LENPEN=0.6; D_CKPT=last; D_AVG=0; REMOVE_BPE=(--remove-bpe sentencepiece) ;;
    "") die "--benchmark is required: iwslt14, wmt14 or opus100" ;;
    *) die "unknown --benchmark '$BENCHMARK': choose iwslt14, wmt14 or opus100" ;;
esac
read -r SRC TGT <<< "$(benchmark_langs "$BENCHMARK")"
SRC="${SRC_OPT:-$SRC}"
TGT="${TGT_OPT:-$TGT}"
[[ -n "$RUN_DIR" && -d "$RUN_DIR" ]] || die "--run-dir must be an existing run directory, got '$RUN_DIR'"
[[ -n "$DATA" && -d "$DATA" ]] || die "--data must be the binarized data directory, got '$DATA'"
if [[ $BENCHMARK != opus100 ]]; then
    need_binarized "$DATA" "$SRC" "$TGT" "$SUBSET" "$BENCHMARK"
fi
BEAM="${BEAM:-$D_BEAM}"
LENPEN="${LENPEN:-$D_LENPEN}"
if [[ -n "$CHECKPOINT" && -z "$AVERAGE" ]]; then AVERAGE=0; fi
AVERAGE="${AVERAGE:-$D_AVG}"
CHECKPOINT="${CHECKPOINT:-$D_CKPT}"
[[ "$AVERAGE" =~ ^[0-9]+$ ]] || die "--average must be a non-negative integer, got '$AVERAGE'"
if [[ $NEWSTEST_AVERAGE == 1 ]]; then
    [[ $BENCHMARK == wmt14 ]] || die "--newstest-average is for --benchmark wmt14"
elif [[ -n "$NEWSTEST_REFS" ]]; then
    die "--newstest-refs goes with --newstest-average"
fi
# B2T protocol: every year 2010..2016 (never fewer), beam 4, lenpen 0.6 for 2014 and 1.0 otherwise
NEWSTEST_YEARS=(2010 2011 2012 2013 2014 2015 2016)
NEWSTEST_BEAM=4
newstest_lenpen() { if [[ $1 == 2014 ]]; then echo 0.6; else echo 1.0; fi; }
newstest_subset() { if [[ $1 == 2014 ]]; then echo test; else echo "newstest$1"; fi; }

PYTHON="${PYTHON:-python}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
# the plugin folder Python imports, unless FAIRSEQ_RESIDUAL_USER_DIR names one
[[ -n "$USER_DIR" ]] || USER_DIR="$(tools plugin-dir)" || die "cannot find fairseq_residual with $PYTHON: install the project"
command -v fairseq-generate >/dev/null 2>&1 \
    || die "'fairseq-generate' not on PATH (activate the environment where fairseq is installed)"
RUN_DIR="$(cd "$RUN_DIR" && pwd)"
DATA="$(cd "$DATA" && pwd)"
EVAL_DIR="$RUN_DIR/eval"
# the translations go beside the result: RUN_DIR/eval/generate-SUBSET.txt, or beside --out (OUT.generate-...)
# when given, so that an evaluation with other settings never overwrites the run's own translations
if [[ -n "$OUT" && "$(cd "$(dirname "$OUT")" 2>/dev/null && pwd)/$(basename "$OUT")" != "$EVAL_DIR/$SUBSET.json" ]]
then GEN_PREFIX="${OUT%.json}.generate-"; else GEN_PREFIX="$EVAL_DIR/generate-"; fi
OUT="${OUT:-$EVAL_DIR/$SUBSET.json}"
mkdir -p "$EVAL_DIR" "$(dirname "$OUT")"

NEWSTEST_JSON=null
if [[ $NEWSTEST_AVERAGE == 1 ]]; then  # check every year's split and reference before decoding
    NEWSTEST_REFS="${NEWSTEST_REFS:-$(dirname "$DATA")/raw}"
    for y in "${NEWSTEST_YEARS[@]}"; do
        sub="$(newstest_subset "$y")"
        [[ -f "$DATA/$sub.$SRC-$TGT.$SRC.idx" ]] || die "--newstest-average: no split '$sub'" \
            "(newstest$y) in $DATA: prepare it with scripts/prepare-wmt14-en-de.sh --newstest-years" \
            "2010-2016 (the average is never taken over fewer years)"
        if [[ $NEWSTEST_REFS != sacrebleu && ! -f "$NEWSTEST_REFS/newstest$y.$TGT" ]]; then
            case $y in 2014) ts=wmt14/full ;; *) ts="wmt${y:2:2}" ;; esac
            die "--newstest-average: newstest$y reference $NEWSTEST_REFS/newstest$y.$TGT not found;" \
                "on an online machine run 'sacrebleu -t $ts -l $SRC-$TGT --echo ref >" \
                "newstest$y.$TGT' and put it there (or pass --newstest-refs DIR|sacrebleu)"
        fi
    done
    NEWSTEST_JSON="{\"protocol\": \"B2T (github.com/takase/b2t_connection)\", \"beam\": $NEWSTEST_BEAM"
    NEWSTEST_JSON+=", \"lenpen\": {"
    for y in "${NEWSTEST_YEARS[@]}"; do
        NEWSTEST_JSON+="\"newstest$y\": $(newstest_lenpen "$y"), "
    done
    NEWSTEST_JSON="${NEWSTEST_JSON%, }}, \"subset\": {"
    for y in "${NEWSTEST_YEARS[@]}"; do
        NEWSTEST_JSON+="\"newstest$y\": \"$(newstest_subset "$y")\", "
    done
    NEWSTEST_JSON="${NEWSTEST_JSON%, }}}"
fi

if [[ $BENCHMARK == wmt14 ]]; then  # the raw reference, before anything is decoded
    if [[ -z "$RAW_REF" ]]; then
        year=2014; [[ $SUBSET == test1 ]] && year=2013
        RAW_REF="$(dirname "$DATA")/raw/newstest$year.$TGT"
    fi
    [[ -f "$RAW_REF" ]] || die "raw reference $RAW_REF not found: sacreBLEU needs the detokenized" \
        "reference (scripts/prepare-wmt14-en-de.sh writes OUT/raw/newstest2014.de); pass --raw-ref FILE"
fi

# ---- 1. checkpoint ---------------------------------------------------------------------------
AVERAGE_LOG=""
if (( AVERAGE > 0 )); then
    CKPT="$EVAL_DIR/checkpoint_avg_last$AVERAGE.pt"
    log "averaging the last $AVERAGE checkpoints of $RUN_DIR"
    "$PYTHON" "$SCRIPT_DIR/average_checkpoints.py" --inputs "$RUN_DIR" --num-checkpoints "$AVERAGE" \
        --output "$CKPT" --user-dir "$USER_DIR" > "$EVAL_DIR/average.log" \
        || die "checkpoint averaging failed"
    cat "$EVAL_DIR/average.log" >&2
    AVERAGE_LOG="$EVAL_DIR/average.log"
else
    case "$CHECKPOINT" in
        best|last) CKPT="$RUN_DIR/checkpoint_$CHECKPOINT.pt" ;;
        *) CKPT="$CHECKPOINT" ;;
    esac
fi
if [[ -d "$CKPT" ]]; then
    held="$(cd "$CKPT" && ls -t -- *.pt 2>/dev/null | head -3 | tr '\n' ' ')"
    if [[ -n "$held" ]]; then held="in it (${held% })"; else held="(it holds no *.pt)"; fi
    die "--checkpoint $CKPT is a folder: give a checkpoint file $held, or best / last of --run-dir"
fi
[[ -f "$CKPT" ]] || die "checkpoint $CKPT not found (did training finish? see $RUN_DIR/train.log)"
if (( AVERAGE == 0 )); then  # a file from elsewhere, or best / last copied into the run's folder from another run
    why="$(tools checkpoint-fits-run "$CKPT" "$(basename "$RUN_DIR")" 2>&1)" || die "${why##*$'\n'}"  # its last line
fi
if [[ $BENCHMARK != opus100 ]]; then  # a model of the other direction would translate the wrong way
    TRAINED="$(tools checkpoint-langs "$CKPT")" || die "cannot read $CKPT"
    [[ -z "$TRAINED" || "$TRAINED" == "$SRC $TGT" ]] || die "$CKPT was trained ${TRAINED/ /->}, but this" \
        "evaluates $SRC->$TGT (--benchmark $BENCHMARK's direction): pass --source-lang ${TRAINED%% *}" \
        "--target-lang ${TRAINED##* } (and the data of that direction), or evaluate a $SRC->$TGT model"
fi

count_sentences() {  # count_sentences PREFIX...: sentences of each binarized split, one line each
    tools count-sentences "$@" 2>/dev/null || true
}

GEN_COMMON=(--user-dir "$USER_DIR" --path "$CKPT" --gen-subset "$SUBSET"
    --beam "$BEAM" --lenpen "$LENPEN" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B"
    --batch-size "$BATCH_SIZE" --required-batch-size-multiple 1 "${REMOVE_BPE[@]}"
    "${CPU[@]+"${CPU[@]}"}")

generate() {  # generate OUTFILE ARGS...: fairseq-generate, stdout to OUTFILE (written whole or not at all: a
    # failed run leaves an earlier OUTFILE as it was)
    local out=$1; shift
    log "fairseq-generate -> $out"
    fairseq-generate "$DATA" "${GEN_COMMON[@]}" "$@" "${EXTRA[@]+"${EXTRA[@]}"}" \
        > "$out.partial" 2> "$out.log" \
        || { tail -20 "$out.log" >&2; rm -f "$out.partial"; die "fairseq-generate failed (log: $out.log)"; }
    mv -f "$out.partial" "$out"
}

run_name="$(basename "$RUN_DIR")"
META="$(tools eval-meta "$BENCHMARK" "$RUN_DIR" "$run_name" "$CKPT" "$AVERAGE_LOG" "$SUBSET" \
    "$BEAM" "$LENPEN" "$MAX_LEN_A" "$MAX_LEN_B" "$DATA" "$NEWSTEST_JSON" "${NEWSTEST_REFS:-}")" \
    || die "cannot write the evaluation's metadata"

# ---- 2 + 3. generate and score -----------------------------------------------------------------
if [[ $BENCHMARK != opus100 ]]; then
    GEN="${GEN_PREFIX}$SUBSET.txt"
    generate "$GEN" --source-lang "$SRC" --target-lang "$TGT"
    EXPECT="$(count_sentences "$DATA/$SUBSET.$SRC-$TGT.$SRC")"
    SCORE_ARGS=(--benchmark "$BENCHMARK" --generate "$GEN" --target-lang "$TGT")
    [[ -n "$EXPECT" ]] && SCORE_ARGS+=(--expect "$EXPECT")
    [[ $BENCHMARK == wmt14 ]] && SCORE_ARGS+=(--raw-ref "$RAW_REF")
    if [[ $NEWSTEST_AVERAGE == 1 ]]; then
        YEAR_GENS=()
        for y in "${NEWSTEST_YEARS[@]}"; do
            sub="$(newstest_subset "$y")"; lp="$(newstest_lenpen "$y")"
            if [[ $sub == "$SUBSET" && $BEAM == "$NEWSTEST_BEAM" && $LENPEN == "$lp" ]]; then
                YEAR_GENS+=("$y=$GEN")  # the main test split, decoded with the same settings
                continue
            fi
            gen_y="${GEN_PREFIX}newstest$y.txt"
            generate "$gen_y" --source-lang "$SRC" --target-lang "$TGT" --gen-subset "$sub" \
                --beam "$NEWSTEST_BEAM" --lenpen "$lp"
            YEAR_GENS+=("$y=$gen_y")
        done
        SCORE_ARGS+=(--newstest-refs "$NEWSTEST_REFS" --newstest-generate "${YEAR_GENS[@]}")
    fi
else
    for f in langs lang_pairs; do
        [[ -f "$DATA/$f.txt" ]] || die "$DATA/$f.txt not found (scripts/prepare-opus100.sh writes it)"
    done
    LANGS="$(tr -d ' \n' < "$DATA/langs.txt")"
    PAIRS="$(tr -d ' \n' < "$DATA/lang_pairs.txt")"
    RAW_DIR="${RAW_DIR:-$(dirname "$DATA")/raw}"
    DIRECTIONS="${DIRECTIONS:-$PAIRS}"
    GEN_FILES=(); DIRS=(); RAWS=(); PREFIXES=()
    for d in ${DIRECTIONS//,/ }; do
        s="${d%-*}"; t="${d#*-}"
        [[ "$d" == *-* && -n "$s" && -n "$t" && "$s" != "$t" ]] || die "bad direction '$d' (SRC-TGT)"
        # prepare-opus100.sh binarizes every pair as en-xx; fairseq reads xx-en from the same files
        if [[ -f "$DATA/$SUBSET.$s-$t.$s.idx" ]]; then pair="$s-$t"; first=$s
        elif [[ -f "$DATA/$SUBSET.$t-$s.$t.idx" ]]; then pair="$t-$s"; first=$t
        else log "no $SUBSET data for $d: skipped"; continue; fi
        GEN="${GEN_PREFIX}$SUBSET.$d.txt"
        generate "$GEN" --task translation_multi_simple_epoch --langs "$LANGS" --lang-pairs "$PAIRS" \
            --source-lang "$s" --target-lang "$t" --encoder-langtok tgt \
            --max-source-positions 256 --max-target-positions 256 --truncate-source \
            --skip-invalid-size-inputs-valid-test
        GEN_FILES+=("$GEN"); DIRS+=("$d")
        raw="$RAW_DIR/$SUBSET.$pair.$t"
        if [[ -f "$raw" ]]; then RAWS+=("$raw"); else
            log "WARNING: no raw reference $raw: scoring against the T- lines"; RAWS+=(-); fi
        PREFIXES+=("$DATA/$SUBSET.$pair.$first")
    done
    (( ${#DIRS[@]} > 0 )) || die "no direction to evaluate"
    mapfile -t EXPECTS < <(count_sentences "${PREFIXES[@]}")
    SCORE_ARGS=(--benchmark opus100 --generate "${GEN_FILES[@]}" --directions "${DIRS[@]}"
                --raw-ref "${RAWS[@]}")
    [[ " ${EXPECTS[*]} " == *"  "* ]] || SCORE_ARGS+=(--expect "${EXPECTS[@]}")
fi

"$PYTHON" "$SCRIPT_DIR/score_bleu.py" "${SCORE_ARGS[@]}" --meta "$META" --out "$OUT"
log "results: $OUT"
