#!/usr/bin/env bash
# The ranking at width 256 on one GPU: every row of the CPU ranking (docs/results/2026-12-04-ranking.md, 12+12
# layers at width 64) trained again at width 256, at the learning rate that ranking chose for it (its
# ranking.json: --lr-from), one seed, all cells side by side on the GPU (scripts/claims_study.sh --rank warm12
# --device cuda). The budget grows (BUDGETS, default 500, 1000, 2000, 3000 updates): each budget's ranking.md /
# ranking.json is written before the next budget starts, and a larger budget continues every cell from its
# checkpoint, so a run cut short by a time limit keeps the last budget it finished.
#
# Usage, from the repository root, with fairseq importable (scripts/gpu_check.sh installs it; RANKING_S=... there
# runs this script as its last step):   OUT=/some/dir bash scripts/gpu_ranking.sh
# Knobs (environment): PYTHON (python3), DEVICE (cuda; cpu: a dry run at toy sizes, what tests/test_gpu_check.py
#   runs), FROM (the ranking.json whose rates are used, several comma-separated;
#   default the CPU ranking's), SCHEMES (default: every row
#   FROM chose a rate for), WIDTH (256; FFN 2 x width, 4 heads: the CPU ranking's recipe otherwise), SEEDS (1),
#   BUDGETS ("500 1000 2000 3000"), JOBS (cells side by side: 16), EXTRA (more claims_study.sh options).
# Output in "$OUT" (default ./gpu_ranking_out): ranking.md/json/png of the last budget finished, ranking-u<B>.md
#   per budget, cells/ (one folder per row), data/, budgets.tsv (budget, exit status, seconds).
# Exit status: 0 when every budget finished, else the first failing claims_study.sh's.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-./gpu_ranking_out}"
PYTHON="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
if [ "$DEVICE" = cpu ]; then  # the dry run: toy model, tiny budgets and corpus settings (checks the steps)
    : "${WIDTH:=16}" "${BUDGETS:=2 4}" "${JOBS:=2}" "${EXTRA:=--heads 2 --vocab-size 200 --bleu-sentences 5 --max-tokens 512 --warmup 3}"
fi
FROM="${FROM:-docs/results/2026-12-04-ranking/ranking.json}"
WIDTH="${WIDTH:-256}"
SEEDS="${SEEDS:-1}"
BUDGETS="${BUDGETS:-500 1000 2000 3000}"
JOBS="${JOBS:-16}"
EXTRA="${EXTRA:-}"
export PYTHON
# the study starts fairseq-train, -generate, ...: those of $PYTHON's environment, also when it is not on PATH
scripts_dir=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))') && PATH="$scripts_dir:$PATH"
mkdir -p "$OUT"
: > "$OUT/budgets.tsv"

schemes=()
[ -n "${SCHEMES:-}" ] && schemes=(--schemes "$SCHEMES")
status=0
for updates in $BUDGETS; do
    echo "== ranking at width $WIDTH, $updates updates ($(date -u +%T))"
    t0=$SECONDS
    # shellcheck disable=SC2086  # EXTRA: options, split on spaces
    bash scripts/claims_study.sh --rank warm12 --lr-from "$FROM" "${schemes[@]}" --seeds "$SEEDS" \
        --updates "$updates" --width "$WIDTH" --device "$DEVICE" --jobs "$JOBS" --out "$OUT" $EXTRA
    rc=$?
    printf '%s\t%s\t%s\n' "$updates" "$rc" "$(( SECONDS - t0 ))" >> "$OUT/budgets.tsv"
    if [ "$rc" -ne 0 ]; then
        status=$rc
        break
    fi
    cp "$OUT/ranking.md" "$OUT/ranking-u$updates.md"
done
exit "$status"
