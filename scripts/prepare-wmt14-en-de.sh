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

log "step 1/7: archives"
for entry in "${CORPORA[@]}"; do
    IFS='|' read -r archive url corpus <<< "$entry"
    prep fetch --archives "$ARCHIVES" --name "$archive" --url "$url" --dest "$ORIG" \
        --require "$corpus.$SRC" --require "$corpus.$TGT" "${OFFLINE[@]}"
done
prep fetch --archives "$ARCHIVES" --name "$TEST_ARCHIVE" --url "$TEST_URL" --dest "$ORIG" \
    --require "$TEST_SGM_SRC" --require "$TEST_SGM_REF" "${OFFLINE[@]}"
if [[ $NEWSTEST2013 == 1 ]]; then
    prep fetch --archives "$ARCHIVES" --name "$DEV_ARCHIVE" --url "$DEV_URL" --dest "$ORIG" \
        --require dev/newstest2013.$SRC --require dev/newstest2013.$TGT "${OFFLINE[@]}"
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
done

log "step 4/7: valid = every 100th train line"
for l in $SRC $TGT; do
    prep split-every -n 100 -i "$TMP/train.tags.$SRC-$TGT.tok.$l" \
        --nth "$TMP/valid.$l" --rest "$TMP/train.$l"
done

TEST_SPLITS=(test)
[[ $NEWSTEST2013 == 1 ]] && TEST_SPLITS+=(test1)
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
fairseq-preprocess --source-lang $SRC --target-lang $TGT \
    --trainpref "$OUT/train" --validpref "$OUT/valid" --testpref "$TESTPREF" \
    --destdir "$BIN" --joined-dictionary --thresholdtgt 0 --thresholdsrc 0 --workers "$WORKERS"
cp "$OUT/code" "$BIN/code"

for split in train valid "${TEST_SPLITS[@]}"; do
    log "$split: $(wc -l < "$OUT/$split.$SRC") sentence pairs"
done
log "done: binarized data in $BIN; detokenized newstest2014 for sacreBLEU:" \
    "$RAW/newstest2014.$SRC (source), $RAW/newstest2014.$TGT (reference)"
