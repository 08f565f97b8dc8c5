#!/usr/bin/env bash
# OPUS-100 (English-centric, released train/dev/test per en-xx pair): one joint sentencepiece
# model, one shared dictionary, binarized per pair for fairseq's translation_multi_simple_epoch.
# Run with --help for the options.
set -euo pipefail

NAME=prepare-opus100
LOG_TIME=1
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # log, die, need_value, prepare_tools, prep
ARCHIVE=opus-100-corpus-v1.0.tar.gz
URL="https://object.pouta.csc.fi/OPUS-100/v1.0/opus-100-corpus-v1.0.tar.gz"
INNER=opus-100-corpus/v1.0/supervised

OUT=opus100
ARCHIVES=""
BIN=""
VOCAB_SIZE=64000
PAIRS=""
SPM_SAMPLE=100000
SPM_TYPE=unigram
CHAR_COVERAGE=0.9995
WORKERS="$(nproc 2>/dev/null || echo 1)"
OFFLINE=()

usage() {
    cat <<EOF
Usage: $0 [options]

Prepares OPUS-100 (Zhang et al. 2020) for fairseq's translation_multi_simple_epoch task:
  1. takes $ARCHIVE from --archives (when missing and the machine is
     online, downloads $URL);
     uses its $INNER/<pair>/opus.<pair>-{train,dev,test}.<lang> files
     (pair folders are named in alphabetical order: de-en, en-fr, ...);
  2. trains ONE joint sentencepiece model on a sample of at most --spm-sample training
     sentences per language (English included once);
  3. builds ONE fairseq dictionary from the sentencepiece vocabulary and binarizes every pair
     with it (fairseq-preprocess --srcdict/--tgtdict), as en-xx:
       BIN/{train,valid,test}.en-xx.{en,xx}.{bin,idx}, BIN/dict.txt and identical
       BIN/dict.<lang>.txt for every language, BIN/spm.model, BIN/langs.txt (comma-separated
       languages, for --langs) and BIN/lang_pairs.txt (both directions of every pair that has
       a dev set, for --lang-pairs);
     dev becomes 'valid'; pairs without dev/test sets (an, dz, hy, mn, yo in v1.0) get train only;
  4. keeps the raw dev/test text in OUT/raw/{valid,test}.en-xx.{en,xx} for per-direction
     sacreBLEU (decode hypotheses with BIN/spm.model, score against these files).

Options:
  --archives DIR        folder holding $ARCHIVE (default: OUT/orig)
  --out DIR             output folder (default: $OUT); holds orig/, tmp/, spm/, raw/
  --bin-dir DIR         binarized data folder (default: OUT/data-bin)
  --pairs LIST          language pairs to use, comma or space separated, 'xx', 'en-xx' or
                        'xx-en' (default: every pair found in the archive)
  --bpe-size N          sentencepiece vocabulary size (default: $VOCAB_SIZE)
  --spm-sample N        training sentences sampled per language for sentencepiece
                        (default: $SPM_SAMPLE)
  --spm-model-type T    unigram or bpe (default: $SPM_TYPE)
  --character-coverage F  sentencepiece character coverage (default: $CHAR_COVERAGE)
  --workers N           parallel workers (default: $WORKERS)
  --offline             never try to download; stop when the archive is missing
                        (also PREP_OFFLINE=1)
  -h, --help            show this help

Tools: python (with sentencepiece) and fairseq-preprocess are taken from PATH
(\$PYTHON overrides the python interpreter).
EOF
}


while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --archives) need_value "$@"; ARCHIVES="$2"; shift 2 ;;
        --out) need_value "$@"; OUT="$2"; shift 2 ;;
        --bin-dir) need_value "$@"; BIN="$2"; shift 2 ;;
        --pairs) need_value "$@"; PAIRS="$2"; shift 2 ;;
        --bpe-size|--vocab-size) need_value "$@"; VOCAB_SIZE="$2"; shift 2 ;;
        --spm-sample) need_value "$@"; SPM_SAMPLE="$2"; shift 2 ;;
        --spm-model-type) need_value "$@"; SPM_TYPE="$2"; shift 2 ;;
        --character-coverage) need_value "$@"; CHAR_COVERAGE="$2"; shift 2 ;;
        --workers) need_value "$@"; WORKERS="$2"; shift 2 ;;
        --offline) OFFLINE=(--offline); shift ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
for opt in VOCAB_SIZE SPM_SAMPLE WORKERS; do
    need_positive_int "$opt" "${!opt}"
done
[[ "$SPM_TYPE" == unigram || "$SPM_TYPE" == bpe ]] \
    || die "--spm-model-type must be unigram or bpe, got '$SPM_TYPE'"

prepare_tools sentencepiece  # PYTHON, fairseq-preprocess, prep (scripts/lib.sh)

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ARCHIVES="${ARCHIVES:-$OUT/orig}"
BIN="${BIN:-$OUT/data-bin}"
ORIG="$OUT/orig"
TMP="$OUT/tmp"
RAW="$OUT/raw"
SPM="$OUT/spm"
mkdir -p "$ORIG" "$TMP" "$RAW" "$SPM" "$BIN"

log "step 1/5: archive $ARCHIVE"
EXTRACT=()
if [[ -n "$PAIRS" ]]; then
    # only the requested pair folders (either name order); opus-pairs checks they exist
    REQUESTED="$(prep opus-pairs --langs-only --pairs "$PAIRS")"
    for lang in $REQUESTED; do
        EXTRACT+=(--extract "$INNER/en-$lang/" --extract "$INNER/$lang-en/")
    done
else
    EXTRACT+=(--extract "$INNER/")
fi
prep fetch --archives "$ARCHIVES" --name "$ARCHIVE" --url "$URL" --dest "$ORIG" \
    --require "$INNER/" "${EXTRACT[@]}" "${OFFLINE[@]}"

PAIR_LIST="$(prep opus-pairs --root "$ORIG/$INNER" --pairs "$PAIRS" --listing "$ORIG/.$ARCHIVE.listing")"
mapfile -t PAIR_LINES <<< "$PAIR_LIST"
LANGS=(en)
SPM_INPUTS=()
for line in "${PAIR_LINES[@]}"; do
    read -r folder lang <<< "$line"
    LANGS+=("$lang")
    SPM_INPUTS+=("en:$ORIG/$INNER/$folder/opus.$folder-train.en"
                 "$lang:$ORIG/$INNER/$folder/opus.$folder-train.$lang")
done
log "pairs: ${#PAIR_LINES[@]} (${LANGS[*]:1})"

log "step 2/5: joint sentencepiece model ($SPM_TYPE, vocabulary $VOCAB_SIZE)"
prep spm-train --input "${SPM_INPUTS[@]}" --model-prefix "$SPM/spm" --vocab-size "$VOCAB_SIZE" \
    --sample-per-lang "$SPM_SAMPLE" --model-type "$SPM_TYPE" \
    --character-coverage "$CHAR_COVERAGE" --threads "$WORKERS"
cp "$SPM/spm.model" "$SPM/spm.vocab" "$BIN/"

log "step 3/5: shared dictionary"
prep spm-dict --vocab "$SPM/spm.vocab" -o "$BIN/dict.txt"
for lang in "${LANGS[@]}"; do cp "$BIN/dict.txt" "$BIN/dict.$lang.txt"; done

log "step 4/5: encode and binarize each pair"
LANG_PAIRS=()
for line in "${PAIR_LINES[@]}"; do
    read -r folder lang <<< "$line"
    pair="en-$lang"
    args=()
    for split in train dev test; do
        [[ -f "$ORIG/$INNER/$folder/opus.$folder-$split.en" \
           && -f "$ORIG/$INNER/$folder/opus.$folder-$split.$lang" ]] || continue
        name=$split
        [[ $split == dev ]] && name=valid
        for l in en "$lang"; do
            input="$ORIG/$INNER/$folder/opus.$folder-$split.$l"
            prep spm-encode --model "$SPM/spm.model" --workers "$WORKERS" \
                -i "$input" -o "$TMP/$name.$pair.$l"
            [[ $split == train ]] || cp "$input" "$RAW/$name.$pair.$l"
        done
        args+=("--${name}pref" "$TMP/$name.$pair")
    done
    [[ " ${args[*]} " == *" --validpref "* ]] && LANG_PAIRS+=("en-$lang" "$lang-en")
    log "binarizing $pair"
    fairseq-preprocess --source-lang en --target-lang "$lang" "${args[@]}" \
        --srcdict "$BIN/dict.txt" --tgtdict "$BIN/dict.txt" --destdir "$BIN" \
        --workers "$WORKERS" > "$TMP/preprocess.$pair.log" 2>&1 \
        || { cat "$TMP/preprocess.$pair.log" >&2; die "fairseq-preprocess failed for $pair"; }
done

log "step 5/5: language lists"
(IFS=,; echo "${LANGS[*]}") > "$BIN/langs.txt"
(IFS=,; echo "${LANG_PAIRS[*]}") > "$BIN/lang_pairs.txt"
[[ ${#LANG_PAIRS[@]} -gt 0 ]] || log "warning: no selected pair has a dev set; lang_pairs.txt is empty"
log "done: binarized data in $BIN"
log "train with: --task translation_multi_simple_epoch --langs \$(cat $BIN/langs.txt)" \
    "--lang-pairs \$(cat $BIN/lang_pairs.txt) --encoder-langtok tgt ..."
log "raw dev/test text for sacreBLEU: $RAW"
