#!/usr/bin/env bash
# The claims study (the paper's warm-up and depth claims, every scheme x conditions x seeds, CPU or GPU):
# a thin wrapper around scripts/claims_study.py, which does the work. Run with --help for the options;
# see docs/analysis.md for the measured grid, its cost and the verdicts.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"

if ! command -v fairseq-train >/dev/null 2>&1; then
    echo "ERROR: fairseq-train is not on PATH; put the project's virtual environment first:" \
         "PATH=.venv/bin:\$PATH bash $0 $*" >&2
    exit 2
fi

# -u: unbuffered, so progress lines appear as they come
exec "$PYTHON" -u "$SCRIPT_DIR/claims_study.py" "$@"
