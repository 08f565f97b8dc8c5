#!/usr/bin/env bash
# IWSLT14 German-English, prepared as fairseq's examples/translation/prepare-iwslt14.sh does,
# then binarized with a joined dictionary. Run with --help for the options.
set -euo pipefail

NAME=prepare-iwslt14
LOG_TIME=1
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # log, die, need_value, prepare_tools, prep
URL="http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
ARCHIVE=de-en.tgz
SRC=de
TGT=en
LANG_PAIR=de-en
# test = these five sets, concatenated in fairseq's order
TEST_SETS=(IWSLT14.TED.dev2010 IWSLT14.TEDX.dev2012 IWSLT14.TED.tst2010 IWSLT14.TED.tst2011
           IWSLT14.TED.tst2012)

OUT=iwslt14.tokenized.de-en
ARCHIVES=""
BIN=""
BPE_SIZE=10000
WORKERS="$(nproc 2>/dev/null || echo 1)"
OFFLINE=()

usage() {
    cat <<EOF
Usage: $0 [options]

Prepares IWSLT14 De->En (TED talks, CC BY-NC-ND) following fairseq's prepare-iwslt14.sh:
  1. takes $ARCHIVE from --archives (when missing and the machine is online, downloads
     $URL);
  2. train: drops lines with <url>, <talkid> or <keywords>, strips <title>/<description> tags,
     Moses-tokenizes (sacremoses), cleans (length 1..175 tokens, length ratio 1.5),
     lower-cases; valid = every 23rd line of it, train = the other lines;
  3. test = the <seg> text of these sets, in this order (Moses-tokenized, lower-cased):
     ${TEST_SETS[*]:0:2}
     ${TEST_SETS[*]:2};
  4. joint BPE (subword-nmt) learned on train de+en, applied to all splits;
  5. fairseq-preprocess --joined-dictionary (shared vocabulary for de and en).

Options:
  --archives DIR   folder holding $ARCHIVE (default: OUT/orig)
  --out DIR        output folder (default: $OUT); holds orig/ (extracted
                   archive), tmp/, train/valid/test.{de,en} (BPE text), code (BPE codes)
  --bin-dir DIR    binarized data folder (default: OUT/data-bin)
  --bpe-size N     number of BPE merge operations (default: $BPE_SIZE)
  --workers N      parallel workers for tokenization, BPE and binarization (default: $WORKERS)
  --offline        never try to download; stop when an archive is missing (also PREP_OFFLINE=1)
  -h, --help       show this help

Tools: python (with sacremoses and subword-nmt) and fairseq-preprocess are taken from PATH
(\$PYTHON overrides the python interpreter).
Result (full data): 160,239 train / 7,283 valid / 6,750 test sentence pairs.
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
        --offline) OFFLINE=(--offline); shift ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
need_positive_int --bpe-size "$BPE_SIZE"
need_positive_int --workers "$WORKERS"

prepare_tools sacremoses subword_nmt regex  # PYTHON, fairseq-preprocess, prep (scripts/lib.sh)

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ARCHIVES="${ARCHIVES:-$OUT/orig}"
BIN="${BIN:-$OUT/data-bin}"
ORIG="$OUT/orig"
TMP="$OUT/tmp"
mkdir -p "$ORIG" "$TMP" "$BIN"

log "step 1/5: archive $ARCHIVE"
REQUIRE=()
for l in $SRC $TGT; do
    REQUIRE+=(--require "$LANG_PAIR/train.tags.$LANG_PAIR.$l")
    for t in "${TEST_SETS[@]}"; do REQUIRE+=(--require "$LANG_PAIR/$t.$LANG_PAIR.$l.xml"); done
done
prep fetch --archives "$ARCHIVES" --name "$ARCHIVE" --url "$URL" --dest "$ORIG" \
    "${REQUIRE[@]}" "${OFFLINE[@]}"

log "step 2/5: train data (filter tags, tokenize, clean 1..175 ratio 1.5, lowercase)"
for l in $SRC $TGT; do
    prep iwslt-train -i "$ORIG/$LANG_PAIR/train.tags.$LANG_PAIR.$l" \
        | prep tokenize --lang "$l" --workers "$WORKERS" -o "$TMP/train.tags.$LANG_PAIR.tok.$l"
done
prep clean --ratio 1.5 --min 1 --max 175 "$TMP/train.tags.$LANG_PAIR.tok" $SRC $TGT \
    "$TMP/train.tags.$LANG_PAIR.clean"
for l in $SRC $TGT; do
    prep lowercase -i "$TMP/train.tags.$LANG_PAIR.clean.$l" -o "$TMP/train.tags.$LANG_PAIR.$l"
done

log "step 3/5: valid (every 23rd train line) and test (<seg> text, tokenized, lowercased)"
for l in $SRC $TGT; do
    prep split-every -n 23 -i "$TMP/train.tags.$LANG_PAIR.$l" \
        --nth "$TMP/valid.$l" --rest "$TMP/train.$l"
    xml=()
    for t in "${TEST_SETS[@]}"; do xml+=("$ORIG/$LANG_PAIR/$t.$LANG_PAIR.$l.xml"); done
    prep segs -i "${xml[@]}" \
        | prep tokenize --lang "$l" --fix-apostrophe --lower --workers "$WORKERS" -o "$TMP/test.$l"
done

log "step 4/5: joint BPE, $BPE_SIZE merges (subword-nmt)"
cat "$TMP/train.$SRC" "$TMP/train.$TGT" > "$TMP/train.$TGT-$SRC"
"$PYTHON" -m subword_nmt.learn_bpe -s "$BPE_SIZE" --num-workers "$WORKERS" -i "$TMP/train.$TGT-$SRC" -o "$OUT/code"
for l in $SRC $TGT; do
    for split in train valid test; do
        "$PYTHON" -m subword_nmt.apply_bpe -c "$OUT/code" --num-workers "$WORKERS" \
            -i "$TMP/$split.$l" -o "$OUT/$split.$l"
    done
done

log "step 5/5: fairseq-preprocess --joined-dictionary -> $BIN"
fairseq-preprocess --source-lang $SRC --target-lang $TGT \
    --trainpref "$OUT/train" --validpref "$OUT/valid" --testpref "$OUT/test" \
    --destdir "$BIN" --joined-dictionary --workers "$WORKERS"
cp "$OUT/code" "$BIN/code"

for split in train valid test; do
    log "$split: $(wc -l < "$OUT/$split.$SRC") sentence pairs"
done
log "done: binarized data in $BIN (BPE codes: $BIN/code)"
