#!/usr/bin/env bash
# Depth-scaling study (Post-LN vs Pre-LN vs ResiDual at 6/12/24/48 layers, same update budget, CPU):
# a thin wrapper around scripts/depth_study.py, which does the work. Run with --help for the options;
# see docs/analysis.md for the measured timings and results.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"

if ! command -v fairseq-train >/dev/null 2>&1; then
    echo "ERROR: fairseq-train is not on PATH; put the project's virtual environment first:" \
         "PATH=.venv/bin:\$PATH bash $0 $*" >&2
    exit 2
fi

# -u: unbuffered, so progress lines appear as they come
exec "$PYTHON" -u "$SCRIPT_DIR/depth_study.py" "$@"
