#!/usr/bin/env bash
# GPU check: what only a GPU can show, for every registered residual scheme (read from the registry), in
# one command. Each step writes its results into "$OUT" (default ./gpu_out) as soon as they exist (the
# Python steps rewrite their JSON after every scheme or cell: a step cut short keeps what it finished):
#
#   device.json      scripts/device_check.py: per scheme, CUDA vs CPU forward (fp32, TF32 off), incremental
#                    decoding = full forward on CUDA (with a beam reorder), beam search on CUDA, bf16/fp16
#                    forward vs fp32 on CUDA, a training step (fp32, bf16 autocast), a checkpoint saved on
#                    CUDA loaded on the CPU
#   ddp.json         scripts/ddp_check.py under torchrun on 2 GPUs (nccl): ranks equal, DDP = one process,
#                    c10d with device_ids as stock fairseq builds it; only when 2 GPUs are visible
#                    (ddp.skipped says why otherwise)
#   precision.json/.md  scripts/precision_check.py: every scheme's largest running sum at 6/12/24/48 layers
#                    per stack, at initialisation and after a short training, measured by an fp16 forward
#                    (inf: it left fp16's range)
#   overflow.json    scripts/precision_check.py --overflow: real fp16 training (--memory-efficient-fp16) of
#                    ResiDual at c = 1 and c = 0.05 and of Pre-LN, per update: loss scale, skipped or not,
#                    largest forward sum and largest scaled gradient
#   bench_<dtype>.json/.txt  scripts/speed_benchmark.py per dtype: every scheme's training/generation
#                    throughput and peak memory against the stock transformer it builds on
#   summary.txt      the speed goals per dtype x shape x scheme
#   ranking/         with RANKING_S > 0: scripts/gpu_ranking.sh's output (ranking.md per budget reached)
#   steps.tsv        one line per step as it ends: name, exit status, seconds (124: its time limit)
#   <step>.log       each step's output;  setup.log, env.txt  what setup did, versions and GPUs
#
# Usage, from the repository root:   OUT=/some/dir bash scripts/gpu_check.sh
# Knobs (environment): PYTHON (python3), DEVICE (cuda; cpu: a dry run of every step on the CPU at toy
#   sizes, what tests/test_gpu_check.py runs: its defaults are then the toy sizes and limits set below
#   DEVICE, and each knob can still be given), SCHEMES (comma-separated subset; default every scheme),
#   BUDGET_S (570: steps that would start with less than 20 s left are skipped), SHAPES (iwslt6),
#   REPEATS (3), WARMUP (1), GEN_SENTENCES (32 per beam-search batch; 2 on the CPU), DTYPES
#   ("fp32 bf16 fp16"), PREC_DEPTHS (6,12,24,48), PREC_WIDTH (512), PREC_UPDATES (10), OVERFLOW_UPDATES (30),
#   OVERFLOW_RUNS (see overflow.json above), DDP_CONFIGS (default: all of scripts/ddp_check.py's), and per
#   step limits in seconds: DEVICE_S (60), DDP_S (75), PREC_S (120), OVERFLOW_S (45), SPEED_S (90 per dtype);
#   RANKING_S (0: off) adds, after the checks and on top of BUDGET_S, scripts/gpu_ranking.sh (the CPU ranking's
#   rows at width 256, one seed, at its chosen rates; RANKING_SCHEMES: a subset of them) under that limit, into
#   "$OUT/ranking"; cut short by the limit, it keeps the budgets it finished, and after at least one finished
#   budget that is not a failure (its budgets are made to be cut short; before the first, it is).
# Time: at most BUDGET_S plus 10 s kill grace per step, by construction (the step limits add up to 570 s);
#   the limits are estimates, not measured on a GPU. Setup, when fairseq must be installed, comes on top.
# Exit status: 0 when every step finished (the ranking: at least one budget), 1 when a step failed, was cut
#   short or skipped, 2/3 when setup failed.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-./gpu_out}"
PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
if [ "$DEVICE" = cpu ]; then  # the dry run: every step at toy sizes, one DDP configuration, fp32 only (fp16
    # has no CPU kernels), and time limits a loaded CPU fits (this checks the steps, not their times)
    : "${SHAPES:=tiny}" "${REPEATS:=1}" "${WARMUP:=0}" "${DTYPES:=fp32}" "${PREC_DEPTHS:=2}" "${PREC_WIDTH:=64}" \
      "${PREC_UPDATES:=1}" "${OVERFLOW_UPDATES:=2}" "${OVERFLOW_RUNS:=resi_dual}" "${DDP_CONFIGS:=legacy_ddp}" \
      "${BUDGET_S:=3000}" "${DEVICE_S:=600}" "${DDP_S:=600}" "${PREC_S:=600}" "${OVERFLOW_S:=600}" "${SPEED_S:=600}"
fi
SCHEMES="${SCHEMES:-}"
BUDGET_S="${BUDGET_S:-570}"
SHAPES="${SHAPES:-iwslt6}"
REPEATS="${REPEATS:-3}"
WARMUP="${WARMUP:-1}"
DTYPES="${DTYPES:-fp32 bf16 fp16}"
PREC_DEPTHS="${PREC_DEPTHS:-6,12,24,48}"
PREC_WIDTH="${PREC_WIDTH:-512}"
PREC_UPDATES="${PREC_UPDATES:-10}"
OVERFLOW_UPDATES="${OVERFLOW_UPDATES:-30}"
OVERFLOW_RUNS="${OVERFLOW_RUNS:-resi_dual,resi_dual:--resi-dual-scale 0.05,pre_ln}"
DEVICE_S="${DEVICE_S:-60}"
DDP_S="${DDP_S:-75}"
PREC_S="${PREC_S:-120}"
OVERFLOW_S="${OVERFLOW_S:-45}"
SPEED_S="${SPEED_S:-90}"
RANKING_S="${RANKING_S:-0}"
RANKING_SCHEMES="${RANKING_SCHEMES:-}"
GEN_SENTENCES="${GEN_SENTENCES:-$([ "$DEVICE" = cpu ] && echo 2 || echo 32)}"
DDP_CONFIGS="${DDP_CONFIGS:-}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
: > "$OUT/steps.tsv"

# =============================================================================================
# setup: make `import fairseq` work: already importable; else wheels in .whl/ (offline; git-ignored:
# carry it to the machine); else `pip install --no-build-isolation fairseq-fixed==0.12.3.1` (a source
# build, minutes). The installed torch and numpy are pinned (PIP_CONSTRAINT) so that pip cannot replace the
# CUDA torch (fairseq-fixed depends on torchaudio, which pins an exact torch).
# =============================================================================================
probe() {  # one Python start: torch, CUDA when asked for, fairseq; writes env.txt. 2: no torch, 4: no CUDA, 5: no fairseq
    DEVICE="$DEVICE" "$PY" - > "$OUT/env.txt" 2>&1 <<'EOF'
import os, sys
try:
    import torch
except ImportError:
    sys.exit(2)
gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
if os.environ["DEVICE"] != "cpu" and not torch.cuda.is_available():
    sys.exit(4)
try:
    import fairseq
except ImportError:
    sys.exit(5)
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| fairseq", fairseq.__version__, "| gpus:", ", ".join(gpus) or "none")
print("gpu_count", len(gpus))
EOF
}

setup() {
    echo "== setup ($(date -u +%FT%TZ))"
    probe
    local rc=$?
    case $rc in
        0) echo "torch and fairseq are importable: nothing to install"; return 0 ;;
        2) echo "gpu_check: '$PY' cannot import torch: install a CUDA build of torch, or set PYTHON=..."; return 2 ;;
        4) echo "gpu_check: torch.cuda.is_available() is False for '$PY': no GPU visible or a CPU-only torch"
           echo "  (DEVICE=cpu runs every step on the CPU as a dry run)"; return 2 ;;
        5) ;;
        *) cat "$OUT/env.txt"; return 2 ;;
    esac
    local constraints="$OUT/pip-constraints.txt"
    "$PY" -c 'import torch; print("torch==" + torch.__version__)' > "$constraints"
    "$PY" -c 'import numpy; print("numpy==" + numpy.__version__)' >> "$constraints" 2>/dev/null
    export PIP_CONSTRAINT="$constraints"
    export PIP_BREAK_SYSTEM_PACKAGES=1  # a disposable machine's system Python may be "externally managed"
    if ls .whl/*.whl >/dev/null 2>&1; then
        echo "installing fairseq from .whl/ (offline)"
        "$PY" -m pip install --no-index --find-links .whl fairseq-fixed \
            || "$PY" -m pip install --no-index --no-deps .whl/*.whl
    else
        echo "no .whl/ directory: installing fairseq-fixed==0.12.3.1 from the package index (source build)"
        "$PY" -m pip install --retries 0 --timeout 20 cython numpy setuptools wheel \
            && "$PY" -m pip install --retries 0 --timeout 20 --no-build-isolation fairseq-fixed==0.12.3.1
    fi
    if ! probe; then
        echo "gpu_check: fairseq is still not importable. Without network, build the wheels elsewhere for this"
        echo "  machine's Python: pip wheel --no-build-isolation fairseq-fixed==0.12.3.1 -w .whl (needs a"
        echo "  compiler), put them and their dependencies' wheels in .whl/ and carry .whl to this machine."
        return 3
    fi
}

setup 2>&1 | tee "$OUT/setup.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || exit "$rc"
head -n 1 "$OUT/env.txt"
GPUS=$(sed -n 's/^gpu_count //p' "$OUT/env.txt")
GPUS=${GPUS:-0}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$OUT/env.txt" 2>&1

# =============================================================================================
# steps: each under its own time limit and the shared budget; each line of steps.tsv is written as the
# step ends
# =============================================================================================
start=$SECONDS
failed=0
step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    local left=$(( BUDGET_S - (SECONDS - start) ))
    if [ "$left" -lt 20 ]; then
        echo "== $name: skipped, ${left}s of the ${BUDGET_S}s budget left"
        printf '%s\tskipped\t0\n' "$name" >> "$OUT/steps.tsv"
        failed=1
        return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    echo "== $name (limit ${limit}s, $(date -u +%T))"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( SECONDS - t0 ))" >> "$OUT/steps.tsv"
    grep -v -e '^INFO' -e '^DEBUG' -e 'Warning' -e '^ *warnings.warn' "$OUT/$name.log" | tail -n 25
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "== $name: exit status $rc$([ "$rc" -ge 124 ] && echo ' (time limit)')"
    fi
}

scheme_args=()
[ -n "$SCHEMES" ] && scheme_args=(--schemes "$SCHEMES")
if [ "$DEVICE" = cpu ]; then  # the dry run: toy sizes
    prec_size=(--embed-dim 16 --ffn-dim 16 --heads 2 --batch 4 --batches 1)
    speed_models=(--models "transformer_post_ln,transformer_pre_ln,${SCHEMES:-post_ln}")
else
    prec_size=(--embed-dim "$PREC_WIDTH" --ffn-dim $(( 4 * PREC_WIDTH )) --heads 8)
    speed_models=()
    [ -n "$SCHEMES" ] && speed_models=(--models "transformer_post_ln,transformer_pre_ln,$SCHEMES")
fi

step device "$DEVICE_S" "$PY" scripts/device_check.py --device "$DEVICE" "${scheme_args[@]}" --out "$OUT/device.json"

if [ "$GPUS" -ge 2 ] || [ "$DEVICE" = cpu ]; then  # on the CPU: gloo, the same script
    ddp_args=()
    [ -n "$DDP_CONFIGS" ] && ddp_args=(--configs "$DDP_CONFIGS")
    step ddp "$DDP_S" "$PY" -m torch.distributed.run --nnodes 1 --nproc_per_node 2 --master_port 29517 \
        scripts/ddp_check.py --device "$DEVICE" "${scheme_args[@]}" "${ddp_args[@]}" --out "$OUT/ddp.json"
else
    echo "$GPUS GPU(s) visible: the 2-GPU DDP check needs two" | tee "$OUT/ddp.skipped"
fi

step precision "$PREC_S" "$PY" scripts/precision_check.py --device "$DEVICE" --dtype fp16 "${scheme_args[@]}" \
    --depths "$PREC_DEPTHS" --updates "$PREC_UPDATES" "${prec_size[@]}" \
    --out "$OUT/precision.json" --markdown "$OUT/precision.md"

step overflow "$OVERFLOW_S" "$PY" scripts/precision_check.py --device "$DEVICE" \
    --overflow "$OVERFLOW_RUNS" --layers-fp16 "${PREC_DEPTHS##*,}" \
    --updates "$OVERFLOW_UPDATES" "${prec_size[@]}" --out "$OUT/overflow.json"

for dtype in $DTYPES; do
    step "bench_$dtype" "$SPEED_S" "$PY" scripts/speed_benchmark.py --device "$DEVICE" --dtype "$dtype" \
        --shapes "$SHAPES" --repeats "$REPEATS" --warmup "$WARMUP" --gen-sentences "$GEN_SENTENCES" "${speed_models[@]}" \
        --out "$OUT/bench_$dtype.json"
    cp "$OUT/bench_$dtype.log" "$OUT/bench_$dtype.txt"
done

if [ "$RANKING_S" -gt 0 ]; then  # opt-in, after the checks and on its own time: the ranking at width 256
    BUDGET_S=$(( BUDGET_S + RANKING_S ))
    failed_before=$failed
    step ranking "$RANKING_S" env OUT="$OUT/ranking" DEVICE="$DEVICE" PYTHON="$PY" SCHEMES="$RANKING_SCHEMES" \
        bash scripts/gpu_ranking.sh
    # growing budgets are made to be cut short: stopped by RANKING_S after one budget finished, the step stands
    # (its last finished budget's report is written) and does not fail the check
    rank_rc=$(tail -n 1 "$OUT/steps.tsv" | cut -f 2)
    done_budgets=$(awk -F '\t' '$2 == 0 {b = $1} END {print b}' "$OUT/ranking/budgets.tsv" 2>/dev/null)
    if { [ "$rank_rc" = 124 ] || [ "$rank_rc" = 137 ]; } && [ -n "$done_budgets" ]; then
        failed=$failed_before
        echo "== ranking: cut short by RANKING_S=${RANKING_S}s after the ${done_budgets}-update budget, whose" \
             "report stands ($OUT/ranking/ranking-u${done_budgets}.md); not counted as a failure"
    fi
fi

PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m residual_studies.shell speed-summary "$OUT" $DTYPES 2>&1 | tee "$OUT/summary.txt"
echo "== done in $(( SECONDS - start ))s; steps: $(tr '\t\n' ' ;' < "$OUT/steps.tsv")"
exit "$failed"
