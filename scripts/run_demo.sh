#!/usr/bin/env bash
# German->English demo (Post-LN vs Pre-LN vs ResiDual on the Ding corpus): a thin wrapper around
# scripts/demo.py, which does the work. `make demo` and `make demo-long` call it with the project's
# .venv/bin first on PATH. Run with --help for the options.
set -euo pipefail

NAME="$(basename "$0" .sh)"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # SCRIPT_DIR, need_fairseq_train
PYTHON="${PYTHON:-python3}"

need_fairseq_train "run 'make demo' (it installs .venv), or put the project's virtual environment first: PATH=.venv/bin:\$PATH bash $0 $*"

# -u: unbuffered, so fairseq's progress lines appear as they come
exec "$PYTHON" -u "$SCRIPT_DIR/demo.py" "$@"
