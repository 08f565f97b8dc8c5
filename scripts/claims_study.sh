#!/usr/bin/env bash
# The claims study (the paper's warm-up and depth claims, every scheme x conditions x seeds, CPU or GPU):
# a thin wrapper around scripts/claims_study.py, which does the work. Run with --help for the options;
# docs/analysis.md says how to run it; the measured grids, their cost and the verdicts are in docs/results/
# (*-claims-study.md, *-ranking*.md).
set -euo pipefail

NAME="$(basename "$0" .sh)"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # SCRIPT_DIR, need_fairseq_train
PYTHON="${PYTHON:-python3}"

need_fairseq_train "put the project's virtual environment first: PATH=.venv/bin:\$PATH bash $0 $*"

# -u: unbuffered, so progress lines appear as they come
exec "$PYTHON" -u "$SCRIPT_DIR/claims_study.py" "$@"
