# shellcheck shell=bash
# Shared by the shell scripts in scripts/: logging, errors, option values and the Python tools.
# Source it after setting NAME (the tag of every message):
#
#   NAME=train; source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# LOG_TIME=1 adds the time of day to log lines; LOG_TO_STDERR=1 sends them to stderr (for scripts
# whose stdout is data). Sets SCRIPT_DIR (scripts/) and REPO (the checkout).

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$SCRIPT_DIR")"
LOG_TIME="${LOG_TIME:-0}"
LOG_TO_STDERR="${LOG_TO_STDERR:-0}"

log() {
    local tag="[$NAME]"
    [[ $LOG_TIME == 1 ]] && tag+=" $(date +%H:%M:%S)"
    if [[ $LOG_TO_STDERR == 1 ]]; then echo "$tag $*" >&2; else echo "$tag $*"; fi
}
warn() { echo "[$NAME] WARNING: $*" >&2; }
die() { echo "[$NAME] ERROR: $*" >&2; exit 2; }
# need_value OPTION "$@" tail: the option has a non-empty value
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "option $1 needs a value (see --help)"; }
# need_positive_int LABEL VALUE
need_positive_int() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"; }

# tools CMD ARGS...: python -m residual_studies.shell, the study tooling beside this file (scripts/ on the
# path; fairseq_residual is the one Python imports: the installed plugin, or this checkout's without one)
tools() {
    PYTHONPATH="$SCRIPT_DIR${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m residual_studies.shell "$@"
}

# prepare_tools MODULE...: PYTHON (python, else python3) with MODULE... importable and
# fairseq-preprocess on PATH, for the prepare-*.sh scripts; they run their steps with prep
prepare_tools() {
    PYTHON="${PYTHON:-python}"
    command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
    command -v "$PYTHON" >/dev/null 2>&1 || die "no 'python' on PATH"
    command -v fairseq-preprocess >/dev/null 2>&1 \
        || die "'fairseq-preprocess' not on PATH (activate the environment where fairseq is installed)"
    prep check-deps "$@"
}
# prep STEP ARGS...: one corpus preparation step (scripts/prepare_corpus.py over residual_studies.corpus_steps: standard
# library only, no plugin import, a fraction of a second per step)
prep() { "$PYTHON" "$SCRIPT_DIR/prepare_corpus.py" "$@"; }

# benchmark_langs BENCHMARK: "SRC TGT" of iwslt14 / wmt14 (their configs' task.source_lang / task.target_lang);
# nothing for opus100, whose directions come from its data directory
benchmark_langs() {
    case "$1" in
        iwslt14) echo "de en" ;;
        wmt14) echo "en de" ;;
    esac
}

# need_binarized DIR SRC TGT SPLIT BENCHMARK: stop unless DIR holds what fairseq-preprocess writes for SRC->TGT
# with SPLIT (the dictionaries and SPLIT's .idx files, of SRC-TGT or TGT-SRC), naming what is missing, what DIR holds and the
# benchmark's prepare script, whose output folder --data should be
need_binarized() {
    local dir="$1" src="$2" tgt="$3" split="$4" prepare="prepare-$5.sh" f missing=() held
    [[ $5 == wmt14 ]] && prepare=prepare-wmt14-en-de.sh
    for f in "dict.$src.txt" "dict.$tgt.txt"; do
        [[ -f "$dir/$f" ]] || missing+=("$f")
    done
    for f in "$src" "$tgt"; do  # fairseq reads a pair binarized either way round (load_langpair_dataset)
        [[ -f "$dir/$split.$src-$tgt.$f.idx" || -f "$dir/$split.$tgt-$src.$f.idx" ]] || missing+=("$split.$src-$tgt.$f.idx")
    done
    (( ${#missing[@]} == 0 )) && return 0
    held="$(cd "$dir" && find . -mindepth 1 -maxdepth 1 -printf '%f\n' | LC_ALL=C sort | head -n 6 | paste -sd ' ' -)"
    (( $(find "$dir" -mindepth 1 -maxdepth 1 | wc -l) > 6 )) && held+=" ..."
    die "--data $dir has no ${missing[*]} (it holds: ${held:-nothing}): give the folder fairseq-preprocess" \
        "wrote for $src->$tgt (its --destdir; scripts/$prepare writes one)"
}

# need_fairseq_train HINT: stop unless fairseq-train is on PATH (HINT: how to get it there)
need_fairseq_train() {
    if ! command -v fairseq-train >/dev/null 2>&1; then
        echo "ERROR: fairseq-train is not on PATH; $1" >&2
        exit 2
    fi
}
