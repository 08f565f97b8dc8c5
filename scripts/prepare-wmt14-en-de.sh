#!/usr/bin/env bash
# WMT14 English-German, prepared as fairseq's examples/translation/prepare-wmt14en2de.sh
# (--icml17 variant: news-commentary v9) does, then binarized with a joined dictionary.
# Run with --help for the options.
set -euo pipefail

NAME=prepare-wmt14-en-de
LOG_TIME=1
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # log, die, need_value, prepare_tools, prep
SRC=en
TGT=de

OUT=wmt14_en_de
ARCHIVES=""
BIN=""
BPE_SIZE=40000
WORKERS="$(nproc 2>/dev/null || echo 1)"
NC_VERSION=9
NEWSTEST2013=0
NEWSTEST_YEARS=""
NEWSTEST_DIR=""
OFFLINE=()

usage() {
    cat <<EOF
Usage: $0 [options]

Prepares WMT14 En->De following fairseq's prepare-wmt14en2de.sh (--icml17):
  1. takes the archives from --archives (downloaded from statmt.org when missing and the
     machine is online):
       training-parallel-europarl-v7.tgz   http://statmt.org/wmt13/training-parallel-europarl-v7.tgz
       training-parallel-commoncrawl.tgz   http://statmt.org/wmt13/training-parallel-commoncrawl.tgz
       training-parallel-nc-v9.tgz         http://statmt.org/wmt14/training-parallel-nc-v9.tgz
         (or, with --nc-version 12, training-parallel-nc-v12.tgz from
          http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz)
       test-full.tgz                       http://statmt.org/wmt14/test-full.tgz
       dev.tgz (only with --newstest2013)  http://data.statmt.org/wmt17/translation-task/dev.tgz
  2. train = europarl v7 + commoncrawl + news-commentary: Moses punctuation normalization,
     non-printing character removal, Moses tokenization with aggressive hyphen splitting (@-@);
  3. test = newstest2014 (<seg> text of newstest2014-deen-src.en.sgm / -ref.de.sgm), tokenized
     the same way (-a); its detokenized text is kept in OUT/raw/ for sacreBLEU;
  4. valid = every 100th train line, train = the other lines;
  5. joint BPE (subword-nmt) learned on train en+de, applied to all splits;
  6. clean train and valid after BPE (length 1..250, ratio 1.5); test is not cleaned;
  7. fairseq-preprocess --joined-dictionary.

Options:
  --archives DIR     folder holding the archives (default: OUT/orig)
  --out DIR          output folder (default: $OUT); holds orig/, tmp/, raw/ (detokenized test
                     text), train/valid/test.{en,de} (BPE text), code and the binarized data
  --bin-dir DIR      binarized data folder (default: OUT/data-bin)
  --bpe-size N       number of BPE merge operations (default: $BPE_SIZE)
  --workers N        parallel workers (default: $WORKERS)
  --nc-version 9|12  news-commentary release (default: $NC_VERSION, as the WMT14 / ICML17 data)
  --newstest2013     also prepare newstest2013 (from dev.tgz) as the extra test split 'test1'
                     (tokenized like the test set; raw text in OUT/raw/)
  --newstest-years Y also prepare these newstest years (e.g. 2010-2016, or 2012,2015) as extra
                     test splits named newstestYYYY (tokenized and BPE-encoded like the test set,
                     binarized with the training dictionary; raw text in OUT/raw/newstestYYYY.{en,de})
                     for scripts/evaluate.sh --newstest-average (sacreBLEU averaged over
                     newstest2010-2016, the B2T protocol). 2014 is the main split 'test' (from
                     test-full.tgz, the same 3003 sentences as sacreBLEU's wmt14/full). Off by default
  --newstest-dir DIR folder with the raw (plain text, one segment per line) newstestYYYY.en and
                     newstestYYYY.de of each year; without it the text comes from sacreBLEU's test
                     sets (sacrebleu -t wmtYY -l en-de --echo src / --echo ref) when online
  --offline          never try to download; stop when an archive is missing (also PREP_OFFLINE=1)
  -h, --help         show this help

Tools: python (with sacremoses and subword-nmt) and fairseq-preprocess are taken from PATH
(\$PYTHON overrides the python interpreter).
EOF
}


while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --archives) need_value "$@"; ARCHIVES="$2"; shift 2 ;;
        --out) need_value "$@"; OUT="$2"; shift 2 ;;
        --bin-dir) need_value "$@"; BIN="$2"; shift 2 ;;
        --bpe-size) need_value "$@"; BPE_SIZE="$2"; shift 2 ;;
        --workers) need_value "$@"; WORKERS="$2"; shift 2 ;;
        --nc-version) need_value "$@"; NC_VERSION="$2"; shift 2 ;;
        --newstest2013) NEWSTEST2013=1; shift ;;
        --newstest-years) need_value "$@"; NEWSTEST_YEARS="$2"; shift 2 ;;
        --newstest-dir) need_value "$@"; NEWSTEST_DIR="$2"; shift 2 ;;
        --offline) OFFLINE=(--offline); shift ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
need_positive_int --bpe-size "$BPE_SIZE"
need_positive_int --workers "$WORKERS"
case "$NC_VERSION" in
    9) NC_URL="http://statmt.org/wmt14/training-parallel-nc-v9.tgz" ;;
    12) NC_URL="http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz" ;;
    *) die "--nc-version must be 9 or 12, got '$NC_VERSION'" ;;
esac

# --newstest-years: 2010-2016 or a comma-separated list; 2014 is the main test split
YEARS=()
if [[ -n "$NEWSTEST_YEARS" ]]; then
    for part in ${NEWSTEST_YEARS//,/ }; do
        if [[ "$part" =~ ^(20[0-9][0-9])-(20[0-9][0-9])$ ]] && (( BASH_REMATCH[1] <= BASH_REMATCH[2] )); then
            for ((y = BASH_REMATCH[1]; y <= BASH_REMATCH[2]; y++)); do YEARS+=("$y"); done
        elif [[ "$part" =~ ^20[0-9][0-9]$ ]]; then YEARS+=("$part")
        else die "--newstest-years takes years like 2010-2016 or 2012,2015, got '$NEWSTEST_YEARS'"; fi
    done
fi
EXTRA_YEARS=()  # the years prepared as splits newstestYYYY (all but 2014)
for y in "${YEARS[@]+"${YEARS[@]}"}"; do
    (( y >= 2008 && y <= 2020 )) || die "--newstest-years: no WMT En-De newstest for $y here (2008-2020)"
    [[ $y == 2014 || " ${EXTRA_YEARS[*]+"${EXTRA_YEARS[*]}"} " == *" $y "* ]] || EXTRA_YEARS+=("$y")
done
if [[ -n "$NEWSTEST_DIR" ]]; then
    [[ ${#YEARS[@]} -gt 0 ]] || die "--newstest-dir is used with --newstest-years"
    [[ -d "$NEWSTEST_DIR" ]] || die "--newstest-dir '$NEWSTEST_DIR' is not a directory"
fi

# archive name | URL | corpus path inside the archive (without the .en/.de suffix)
CORPORA=(
    "training-parallel-europarl-v7.tgz|http://statmt.org/wmt13/training-parallel-europarl-v7.tgz|training/europarl-v7.de-en"
    "training-parallel-commoncrawl.tgz|http://statmt.org/wmt13/training-parallel-commoncrawl.tgz|commoncrawl.de-en"
    "training-parallel-nc-v$NC_VERSION.tgz|$NC_URL|training/news-commentary-v$NC_VERSION.de-en"
)
TEST_ARCHIVE=test-full.tgz
TEST_URL="http://statmt.org/wmt14/test-full.tgz"
TEST_SGM_SRC=test-full/newstest2014-deen-src.$SRC.sgm
TEST_SGM_REF=test-full/newstest2014-deen-ref.$TGT.sgm
DEV_ARCHIVE=dev.tgz
DEV_URL="http://data.statmt.org/wmt17/translation-task/dev.tgz"

prepare_tools sacremoses subword_nmt regex  # PYTHON, fairseq-preprocess, prep (scripts/lib.sh)

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ARCHIVES="${ARCHIVES:-$OUT/orig}"
BIN="${BIN:-$OUT/data-bin}"
ORIG="$OUT/orig"
TMP="$OUT/tmp"
RAW="$OUT/raw"
mkdir -p "$ORIG" "$TMP" "$RAW" "$BIN"

is_offline() { [[ ${#OFFLINE[@]} -gt 0 || "${PREP_OFFLINE:-}" != "" && "${PREP_OFFLINE:-}" != 0 ]]; }
log "step 1/7: archives"
if is_offline; then  # name every missing archive at once, not one per run
    missing=()
    for entry in "${CORPORA[@]}" "$TEST_ARCHIVE|$TEST_URL|" ; do
        IFS='|' read -r archive url _ <<< "$entry"
        [[ -f "$ARCHIVES/$archive" ]] || missing+=("$archive ($url)")
    done
    [[ $NEWSTEST2013 != 1 || -f "$ARCHIVES/$DEV_ARCHIVE" ]] || missing+=("$DEV_ARCHIVE ($DEV_URL)")
    [[ ${#missing[@]} -eq 0 ]] || die "offline mode, and ${#missing[@]} archive(s) are not in $ARCHIVES:" \
        "$(printf '%s; ' "${missing[@]}")put them there, or" \
        "drop --offline / PREP_OFFLINE to let the script download them"
fi
for entry in "${CORPORA[@]}"; do
    IFS='|' read -r archive url corpus <<< "$entry"
    prep fetch --archives "$ARCHIVES" --name "$archive" --url "$url" --dest "$ORIG" \
        --require "$corpus.$SRC" --require "$corpus.$TGT" "${OFFLINE[@]}"
done
prep fetch --archives "$ARCHIVES" --name "$TEST_ARCHIVE" --url "$TEST_URL" --dest "$ORIG" \
    --require "$TEST_SGM_SRC" --require "$TEST_SGM_REF" "${OFFLINE[@]}"
for y in "${EXTRA_YEARS[@]+"${EXTRA_YEARS[@]}"}"; do
    # raw newstestYYYY.{en,de}: from --newstest-dir, else sacreBLEU's test set wmtYY (online)
    testset="wmt${y:2:2}"
    how="on an online machine: sacrebleu -t $testset -l $SRC-$TGT --echo src > newstest$y.$SRC;"
    how+=" sacrebleu -t $testset -l $SRC-$TGT --echo ref > newstest$y.$TGT; then pass the folder"
    how+=" holding them as --newstest-dir"
    if [[ -n "$NEWSTEST_DIR" ]]; then
        for l in $SRC $TGT; do
            [[ -s "$NEWSTEST_DIR/newstest$y.$l" ]] || die "newstest$y: $NEWSTEST_DIR/newstest$y.$l" \
                "not found (or empty); --newstest-years needs every year's newstestYYYY.$SRC and" \
                ".$TGT. To get it, $how"
            cp "$NEWSTEST_DIR/newstest$y.$l" "$RAW/newstest$y.$l"
        done
    elif is_offline; then
        die "newstest$y: offline and no --newstest-dir: --newstest-years needs the raw" \
            "newstest$y.$SRC and newstest$y.$TGT. To get them, $how"
    else
        log "  newstest$y from sacreBLEU ($testset $SRC-$TGT)"
        for l in $SRC $TGT; do
            side=src; [[ $l == "$TGT" ]] && side=ref
            "$PYTHON" -m sacrebleu -t "$testset" -l "$SRC-$TGT" --echo "$side" > "$RAW/newstest$y.$l.part" \
                && [[ -s "$RAW/newstest$y.$l.part" ]] \
                || die "newstest$y: sacreBLEU could not give $testset $SRC-$TGT --echo $side (offline?)." \
                    "Get the raw text $how"
            mv "$RAW/newstest$y.$l.part" "$RAW/newstest$y.$l"
        done
    fi
    n_src=$(wc -l < "$RAW/newstest$y.$SRC"); n_tgt=$(wc -l < "$RAW/newstest$y.$TGT")
    [[ $n_src == "$n_tgt" ]] || die "newstest$y: newstest$y.$SRC has $n_src lines but" \
        "newstest$y.$TGT has $n_tgt (not the same test set?)"
    log "  newstest$y: $n_src segments -> $RAW/newstest$y.{$SRC,$TGT}"
done
if [[ $NEWSTEST2013 == 1 ]]; then
    prep fetch --archives "$ARCHIVES" --name "$DEV_ARCHIVE" --url "$DEV_URL" --dest "$ORIG" \
        --require dev/newstest2013.$SRC --require dev/newstest2013.$TGT "${OFFLINE[@]}"
    if [[ " ${EXTRA_YEARS[*]+"${EXTRA_YEARS[*]}"} " == *" 2013 "* ]]; then
        for l in $SRC $TGT; do  # both write OUT/raw/newstest2013.*: the same text or neither
            cmp -s "$ORIG/dev/newstest2013.$l" "$RAW/newstest2013.$l" || die "newstest2013.$l of" \
                "$DEV_ARCHIVE differs from the one taken for --newstest-years; use one of" \
                "--newstest2013 and --newstest-years"
        done
    fi
fi

log "step 2/7: train data (normalize punctuation, remove non-printing, tokenize -a)"
for entry in "${CORPORA[@]}"; do
    IFS='|' read -r archive url corpus <<< "$entry"
    n_src=$(wc -l < "$ORIG/$corpus.$SRC")
    n_tgt=$(wc -l < "$ORIG/$corpus.$TGT")
    [[ $n_src == "$n_tgt" ]] || die "$archive is malformed: $corpus.$SRC has $n_src lines" \
        "but $corpus.$TGT has $n_tgt (re-download it from $url)"
    log "  $corpus: $n_src sentence pairs"
done
for l in $SRC $TGT; do
    files=()
    for entry in "${CORPORA[@]}"; do
        IFS='|' read -r archive url corpus <<< "$entry"
        files+=("$ORIG/$corpus.$l")
    done
    prep tokenize --lang "$l" --norm-punct --remove-nonprint --aggressive \
        --workers "$WORKERS" -i "${files[@]}" -o "$TMP/train.tags.$SRC-$TGT.tok.$l"
done

log "step 3/7: test data newstest2014 (tokenize -a; raw text -> $RAW)"
for l in $SRC $TGT; do
    if [[ $l == "$SRC" ]]; then sgm="$ORIG/$TEST_SGM_SRC"; else sgm="$ORIG/$TEST_SGM_REF"; fi
    prep segs -i "$sgm" \
        | prep tokenize --lang "$l" --fix-apostrophe --aggressive -o "$TMP/test.$l"
    prep segs --raw -i "$sgm" -o "$RAW/newstest2014.$l"
    if [[ $NEWSTEST2013 == 1 ]]; then
        cp "$ORIG/dev/newstest2013.$l" "$RAW/newstest2013.$l"
        prep tokenize --lang "$l" --fix-apostrophe --aggressive \
            -i "$ORIG/dev/newstest2013.$l" -o "$TMP/test1.$l"
    fi
    for y in "${EXTRA_YEARS[@]+"${EXTRA_YEARS[@]}"}"; do
        prep tokenize --lang "$l" --fix-apostrophe --aggressive \
            -i "$RAW/newstest$y.$l" -o "$TMP/newstest$y.$l"
    done
done

log "step 4/7: valid = every 100th train line"
for l in $SRC $TGT; do
    prep split-every -n 100 -i "$TMP/train.tags.$SRC-$TGT.tok.$l" \
        --nth "$TMP/valid.$l" --rest "$TMP/train.$l"
done

TEST_SPLITS=(test)
[[ $NEWSTEST2013 == 1 ]] && TEST_SPLITS+=(test1)
for y in "${EXTRA_YEARS[@]+"${EXTRA_YEARS[@]}"}"; do TEST_SPLITS+=("newstest$y"); done
log "step 5/7: joint BPE, $BPE_SIZE merges (subword-nmt)"
cat "$TMP/train.$SRC" "$TMP/train.$TGT" > "$TMP/train.$TGT-$SRC"
"$PYTHON" -m subword_nmt.learn_bpe -s "$BPE_SIZE" --num-workers "$WORKERS" -i "$TMP/train.$TGT-$SRC" -o "$OUT/code"
for l in $SRC $TGT; do
    for split in train valid "${TEST_SPLITS[@]}"; do
        "$PYTHON" -m subword_nmt.apply_bpe -c "$OUT/code" --num-workers "$WORKERS" \
            -i "$TMP/$split.$l" -o "$TMP/bpe.$split.$l"
    done
done

log "step 6/7: clean train/valid after BPE (length 1..250, ratio 1.5)"
for split in train valid; do
    prep clean --ratio 1.5 --min 1 --max 250 "$TMP/bpe.$split" $SRC $TGT "$OUT/$split"
done
for l in $SRC $TGT; do
    for split in "${TEST_SPLITS[@]}"; do cp "$TMP/bpe.$split.$l" "$OUT/$split.$l"; done
done

log "step 7/7: fairseq-preprocess --joined-dictionary -> $BIN"
TESTPREF="$OUT/test"
[[ $NEWSTEST2013 == 1 ]] && TESTPREF="$OUT/test,$OUT/test1"
for y in "${EXTRA_YEARS[@]+"${EXTRA_YEARS[@]}"}"; do TESTPREF+=",$OUT/newstest$y"; done
fairseq-preprocess --source-lang $SRC --target-lang $TGT \
    --trainpref "$OUT/train" --validpref "$OUT/valid" --testpref "$TESTPREF" \
    --destdir "$BIN" --joined-dictionary --thresholdtgt 0 --thresholdsrc 0 --workers "$WORKERS"
# fairseq-preprocess names the extra test prefixes test1, test2, ...: the years get their names
k=$NEWSTEST2013
for y in "${EXTRA_YEARS[@]+"${EXTRA_YEARS[@]}"}"; do
    k=$((k + 1))
    for l in $SRC $TGT; do
        for ext in bin idx; do
            mv -f "$BIN/test$k.$SRC-$TGT.$l.$ext" "$BIN/newstest$y.$SRC-$TGT.$l.$ext"
        done
    done
done
cp "$OUT/code" "$BIN/code"

for split in train valid "${TEST_SPLITS[@]}"; do
    log "$split: $(wc -l < "$OUT/$split.$SRC") sentence pairs"
done
log "done: binarized data in $BIN; detokenized newstest2014 for sacreBLEU:" \
    "$RAW/newstest2014.$SRC (source), $RAW/newstest2014.$TGT (reference)"
if [[ ${#YEARS[@]} -gt 0 ]]; then
    log "newstest years ${YEARS[*]}: splits newstestYYYY in $BIN (2014: test), raw text in $RAW"
fi
