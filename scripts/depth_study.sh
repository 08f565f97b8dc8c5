#!/usr/bin/env bash
# Depth-scaling study (every registered scheme at 6/12/24/48 layers, same update budget, CPU):
# a thin wrapper around scripts/depth_study.py, which does the work. Run with --help for the options;
# docs/analysis.md says how to run it; the measured timings and results are in docs/results/ (*-depth-study.md).
set -euo pipefail

NAME="$(basename "$0" .sh)"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # SCRIPT_DIR, need_fairseq_train
PYTHON="${PYTHON:-python3}"

need_fairseq_train "put the project's virtual environment first: PATH=.venv/bin:\$PATH bash $0 $*"

# -u: unbuffered, so progress lines appear as they come
exec "$PYTHON" -u "$SCRIPT_DIR/depth_study.py" "$@"
