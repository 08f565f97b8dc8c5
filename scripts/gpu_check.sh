#!/usr/bin/env bash
# GPU speed check: residual_transformer (post_ln, pre_ln, resi_dual) against fairseq's stock
# transformer on CUDA, in fp32, bf16 and fp16, at the shapes iwslt6 (6+6, 256/1024/4) and deep24
# (24+24, 256/1024/4). Runs scripts/speed_benchmark.py three times, writes into "$OUT" (default ./gpu_out):
#
#   bench_<dtype>.json   the harness's results (written after each shape: a run cut short keeps
#                        what it finished)
#   bench_<dtype>.txt    its table;  bench_<dtype>.err  its stderr
#   summary.txt          one line per dtype x shape x plugin model: ratios to stock and the goals
#   setup.log            what setup did;  env.txt  python / torch / GPU versions
#
# Usage, from the repository root:   OUT=/some/dir bash scripts/gpu_check.sh
# Knobs (environment): PYTHON (python3), SHAPES (iwslt6,deep24), REPEATS (6), WARMUP (1),
#   RUN_TIMEOUT (150 s per dtype), BUDGET_S (450 s for the three runs together: a run that would
#   start with less than RUN_TIMEOUT/2 left is skipped), DTYPES ("fp32 bf16 fp16").
# Time: an estimated 5 minutes of benchmarks on one H200 (not yet measured; at most BUDGET_S,
# plus 10 s kill grace per run, by construction), plus setup when fairseq must be installed (a source build takes minutes).
# Exit status: 0 when every run finished (goals missed or not: read summary.txt), 1 when a run
# failed or was cut short, 2/3 when setup failed.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-./gpu_out}"
PY="${PYTHON:-python3}"
SHAPES="${SHAPES:-iwslt6,deep24}"
REPEATS="${REPEATS:-6}"
WARMUP="${WARMUP:-1}"
RUN_TIMEOUT="${RUN_TIMEOUT:-150}"
BUDGET_S="${BUDGET_S:-450}"
DTYPES="${DTYPES:-fp32 bf16 fp16}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

# =============================================================================================
# setup: make `import fairseq` work. Tries, in order:
#   1. fairseq already importable: nothing to do;
#   2. wheels in .whl/ (e.g. fairseq_fixed-0.12.3.1-cp312-*.whl built for this Python, plus its
#      dependencies hydra-core, omegaconf, antlr4-python3-runtime, bitarray, regex, sacrebleu...):
#      installed offline, first resolving, then as-is without dependency resolution;
#   3. pip from the package index: `pip install --no-build-isolation fairseq-fixed==0.12.3.1`
#      (a source build: needs a C/C++ compiler, Python headers, cython and numpy; takes minutes).
# The installed torch (and numpy) are pinned through PIP_CONSTRAINT so that pip cannot replace the
# CUDA torch (fairseq-fixed depends on torchaudio, which pins an exact torch). .whl/ is git-ignored:
# carry it to the machine explicitly.
# =============================================================================================
setup() {
    echo "== setup ($(date -u +%FT%TZ))"
    if ! "$PY" -c 'import torch' 2>/dev/null; then
        echo "gpu_check: '$PY' cannot import torch: install a CUDA build of torch, or set PYTHON=..."
        return 2
    fi
    if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
        echo "gpu_check: torch.cuda.is_available() is False for '$PY': no GPU visible or a CPU-only torch"
        return 2
    fi
    if "$PY" -c 'import fairseq' 2>/dev/null; then
        echo "fairseq is importable: nothing to install"
        return 0
    fi
    local constraints="$OUT/pip-constraints.txt"
    "$PY" - > "$constraints" <<'EOF'
import torch
print("torch==" + torch.__version__)
try:
    import numpy
    print("numpy==" + numpy.__version__)
except ImportError:
    pass
EOF
    export PIP_CONSTRAINT="$constraints"
    export PIP_BREAK_SYSTEM_PACKAGES=1  # a disposable machine's system Python may be "externally managed"
    echo "pinned for pip: $(tr '\n' ' ' < "$constraints")"
    if ls .whl/*.whl >/dev/null 2>&1; then
        echo "installing fairseq from .whl/ (offline)"
        "$PY" -m pip install --no-index --find-links .whl fairseq-fixed \
            || "$PY" -m pip install --no-index --no-deps .whl/*.whl
    else
        echo "no .whl/ directory: installing fairseq-fixed==0.12.3.1 from the package index (source build)"
        "$PY" -m pip install --retries 0 --timeout 20 cython numpy setuptools wheel \
            && "$PY" -m pip install --retries 0 --timeout 20 --no-build-isolation fairseq-fixed==0.12.3.1
    fi
    if ! "$PY" -c 'import fairseq' ; then
        echo "gpu_check: fairseq is still not importable. Without network, build the wheels elsewhere"
        echo "  for this machine's Python ($("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')):"
        echo "  pip wheel --no-build-isolation fairseq-fixed==0.12.3.1 -w .whl   (needs a compiler), put"
        echo "  them and their dependencies' wheels in .whl/ and carry .whl to this machine."
        return 3
    fi
    echo "fairseq installed"
}

setup 2>&1 | tee "$OUT/setup.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || exit "$rc"

"$PY" - > "$OUT/env.txt" 2>&1 <<'EOF'
import sys, torch, fairseq
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| fairseq", fairseq.__version__, "|", torch.cuda.get_device_name(0),
      "| %.0f GiB" % (torch.cuda.get_device_properties(0).total_memory / 2**30))
EOF
cat "$OUT/env.txt"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu \
    --format=csv >> "$OUT/env.txt" 2>&1

# =============================================================================================
# benchmarks
# =============================================================================================
start=$SECONDS
failed=0
for dtype in $DTYPES; do
    left=$(( BUDGET_S - (SECONDS - start) ))
    if [ "$left" -lt $(( RUN_TIMEOUT / 2 )) ]; then
        echo "== $dtype: skipped, ${left}s of the ${BUDGET_S}s budget left"
        failed=1
        continue
    fi
    limit=$(( left < RUN_TIMEOUT ? left : RUN_TIMEOUT ))
    extra=()
    [ "$dtype" = fp16 ] && extra=(--resi-dual-scale 0.05)  # the paper's fp16 setting
    echo "== $dtype (limit ${limit}s)"
    timeout -k 10 "$limit" "$PY" scripts/speed_benchmark.py --device cuda --dtype "$dtype" \
        --shapes "$SHAPES" --repeats "$REPEATS" --warmup "$WARMUP" --out "$OUT/bench_$dtype.json" \
        "${extra[@]}" 2> "$OUT/bench_$dtype.err" | tee "$OUT/bench_$dtype.txt"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "== $dtype: exit status $rc$([ "$rc" -ge 124 ] && echo ' (time limit)'); last lines of stderr:"
        tail -n 15 "$OUT/bench_$dtype.err"
    fi
    echo "== $dtype: $(( SECONDS - start ))s elapsed"
done

# =============================================================================================
# summary
# =============================================================================================
PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m residual_studies.shell speed-summary "$OUT" $DTYPES \
    | tee "$OUT/summary.txt"
exit "$failed"
