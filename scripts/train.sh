#!/usr/bin/env bash
# Train the paper's benchmarks (IWSLT14 De-En, WMT14 En-De, OPUS-100) with fairseq-hydra-train and
# the configs in configs/: one run, or a grid of schemes x depths x seeds, on one GPU, one node or a
# cluster (torchrun or SLURM). Run with --help for the options; docs/benchmarks.md has examples.
set -euo pipefail

NAME=train
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # SCRIPT_DIR, REPO, log, warn, die, need_value, tools
CONFIG_DIR="$REPO/configs"

BENCHMARK=""
SCHEMES="resi_dual"
DEPTHS=""
SEEDS="1"
DATA=""
SAVE_ROOT=""
GPUS_PER_NODE=1
NODES=1
LAUNCHER=local
PRECISION=""
MAX_TOKENS=4096
UPDATE_FREQ=""
CPU=0
MASTER=""
SLURM_OPTS=""
DRY_RUN=0
EXTRA=()

usage() {
    cat <<'EOF'
Usage: scripts/train.sh --benchmark {iwslt14,wmt14,opus100} --data DIR --save-root DIR [options]

Launches fairseq-hydra-train with configs/<benchmark config>.yaml and the overrides for one run
(--scheme, --layers, --seed) or for every run of a grid (--schemes, --depths, --seeds: comma
separated). Each run trains in SAVE_ROOT/<benchmark>/<scheme>-<N>L-seed<K>/ (checkpoints,
hydra_train.log, train.log, tensorboard/, command.sh, run_settings.json); starting the same run again
resumes it from its checkpoint_last.pt. A run folder whose checkpoints were trained with other training
settings (run_settings.json: the model, optimizer, learning rate and schedule, criterion, seed, precision,
tokens per update; not GPUs, paths, logging or max_update) is refused: use another --save-root.

Options:
  --benchmark B          iwslt14 (configs/iwslt14_de_en.yaml), wmt14 (configs/wmt14_en_de.yaml)
                         or opus100 (configs/opus100.yaml)
  --scheme S, --schemes LIST
                         residual schemes: post_ln, pre_ln, resi_dual or any other registered in
                         fairseq_residual/schemes (default: resi_dual)
  --layers N, --depths LIST
                         layers per stack: N means N encoder + N decoder layers
                         (default: 6 for iwslt14 and wmt14, 18 for opus100)
  --seed K, --seeds LIST random seeds (default: 1)
  --data DIR             binarized data (fairseq-preprocess output, e.g. the data-bin/ made by
                         scripts/prepare-*.sh); for opus100 also holds langs.txt and
                         lang_pairs.txt (made by scripts/prepare-opus100.sh)
  --save-root DIR        root of the run directories
  --gpus-per-node N      GPUs (worker processes) per node (default: 1)
  --nodes M              nodes (default: 1)
  --launcher L           local: fairseq-hydra-train on this node; with N > 1 GPUs fairseq spawns
                                one process per GPU (default)
                         torchrun: torchrun --nnodes M --nproc_per_node N; run the same command on
                                every node (needs --master-addr when M > 1)
                         slurm: writes RUN_DIR/train.sbatch (srun, one task per GPU) and submits
                                it with sbatch
  --precision P          fp32, fp16, bf16 or amp (default: the paper's: fp32 for iwslt14, amp for
                         wmt14, fp16 for opus100; fp32 with --cpu). fp16 with resi_dual sets
                         model.resi_dual_scale=0.05 (unless --extra sets it); bf16 leaves it.
                         fp16 with a scheme whose parameters have their own optimizer settings
                         (its optim_overrides in the registry, e.g. hyper-connections' static
                         weights without weight decay) sets common.fp16_no_flatten_grads=true
                         (fairseq's flat fp32 copy has one parameter group)
  --max-tokens N         tokens per GPU per batch (default: 4096, the paper's)
  --update-freq N        force update_freq (default: computed, see below)
  --cpu                  train on CPU (common.cpu=true, gloo backend, legacy_ddp); for tests and
                         debugging
  --master-addr H[:P]    torchrun rendezvous endpoint for M > 1 nodes (default port 29500)
  --slurm-opts "..."     extra sbatch options, one '#SBATCH' line each
                         (e.g. "--partition=gpu --time=48:00:00 --cpus-per-task=10")
  --extra "OVERRIDES"    more Hydra overrides, space separated; may be repeated; they come last
                         and win (e.g. --extra "optimization.max_update=1000 common.log_interval=10")
  --dry-run              print the commands (and sbatch scripts) of every run, run nothing
  -h, --help             show this help

update_freq: the paper's batch is the table's max_tokens x update_freq, taken as the TOTAL number
of tokens per update over all GPUs (the GPU count is not stated anywhere): 4,096 for iwslt14,
65,536 for wmt14 and opus100. train.sh sets
    update_freq = total tokens / (max_tokens x GPUs per node x nodes)
and refuses GPU counts that do not divide it (lower --max-tokens, or force --update-freq).
EOF
}

quote_arg() {  # one argument, single-quoted when the shell would otherwise change it
    if [[ "$1" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then
        printf '%s' "$1"
    else
        local q="'\\''"
        printf "'%s'" "${1//\'/$q}"
    fi
}

hydra_value() {  # one value of a Hydra override, single-quoted: Hydra's grammar reads , = ( ) [ ] { } ' and
    # spaces in an unquoted value as syntax; inside quotes only the quote itself is escaped (\')
    local q="\\'"
    printf "'%s'" "${1//\'/$q}"
}

quote_cmd() {  # shell-quoted command line; args starting with @RAW@ are printed as they are
    local a out=()
    for a in "$@"; do
        if [[ "$a" == @RAW@* ]]; then out+=("${a#@RAW@}"); else out+=("$(quote_arg "$a")"); fi
    done
    echo "${out[*]}"
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --benchmark) need_value "$@"; BENCHMARK="$2"; shift 2 ;;
        --scheme|--schemes) need_value "$@"; SCHEMES="$2"; shift 2 ;;
        --layers|--depths) need_value "$@"; DEPTHS="$2"; shift 2 ;;
        --seed|--seeds) need_value "$@"; SEEDS="$2"; shift 2 ;;
        --data) need_value "$@"; DATA="$2"; shift 2 ;;
        --save-root) need_value "$@"; SAVE_ROOT="$2"; shift 2 ;;
        --gpus-per-node) need_value "$@"; GPUS_PER_NODE="$2"; shift 2 ;;
        --nodes) need_value "$@"; NODES="$2"; shift 2 ;;
        --launcher) need_value "$@"; LAUNCHER="$2"; shift 2 ;;
        --precision) need_value "$@"; PRECISION="$2"; shift 2 ;;
        --max-tokens) need_value "$@"; MAX_TOKENS="$2"; shift 2 ;;
        --update-freq) need_value "$@"; UPDATE_FREQ="$2"; shift 2 ;;
        --cpu) CPU=1; shift ;;
        --master-addr) need_value "$@"; MASTER="$2"; shift 2 ;;
        --slurm-opts) need_value "$@"; SLURM_OPTS="$2"; shift 2 ;;
        --extra) [[ $# -ge 2 ]] || die "option --extra needs a value"
                 read -r -a words <<< "$2"; EXTRA+=("${words[@]}"); shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

# ---- benchmark: its config; tokens per update, precision and depth are read from it ----------
case "$BENCHMARK" in
    iwslt14) CONFIG=iwslt14_de_en ;;
    wmt14)   CONFIG=wmt14_en_de ;;
    opus100) CONFIG=opus100 ;;
    "") die "--benchmark is required: iwslt14, wmt14 or opus100" ;;
    *) die "unknown --benchmark '$BENCHMARK': choose iwslt14, wmt14 or opus100" ;;
esac
[[ -n "$DATA" ]] || die "--data is required (the binarized data directory)"
[[ -n "$SAVE_ROOT" ]] || die "--save-root is required (runs go to SAVE_ROOT/$BENCHMARK/...)"

PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
# configs/$CONFIG.yaml's max_tokens x update_freq (the paper's tokens per update on one GPU), its
# precision and encoder depth; the run directory's name pattern; the folder of the plugin Python imports
# (the --user-dir, unless FAIRSEQ_RESIDUAL_USER_DIR names one); the registered schemes; those whose parameters
# carry their own optimizer settings (no weight decay, a learning-rate factor), which need fairseq's
# per-parameter fp32 master copy under fp16 (common.fp16_no_flatten_grads=true): one Python start-up
DEFAULTS="$(tools train-defaults "$CONFIG")" \
    || die "cannot find fairseq_residual with $PYTHON: install the project (pip install -e .)"
{ read -r TOTAL_TOKENS DEFAULT_PRECISION DEFAULT_DEPTH; read -r RUN_NAME; read -r PLUGIN_DIR
  read -r KNOWN_SCHEMES; read -r PER_PARAMETER_FP16; } <<< "$DEFAULTS"
USER_DIR="${FAIRSEQ_RESIDUAL_USER_DIR:-$PLUGIN_DIR}"
DEPTHS="${DEPTHS:-$DEFAULT_DEPTH}"

split_list() { tr ',' ' ' <<< "$1"; }
read -r -a SCHEME_LIST <<< "$(split_list "$SCHEMES")"
read -r -a DEPTH_LIST <<< "$(split_list "$DEPTHS")"
read -r -a SEED_LIST <<< "$(split_list "$SEEDS")"
for s in "${SCHEME_LIST[@]}"; do
    [[ " $KNOWN_SCHEMES " == *" $s "* ]] || die "unknown scheme '$s': choose one of ${KNOWN_SCHEMES// /, }"
done
for n in "${DEPTH_LIST[@]}"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "--layers/--depths: '$n' is not a positive integer"
done
for k in "${SEED_LIST[@]}"; do
    [[ "$k" =~ ^[0-9]+$ ]] || die "--seed/--seeds: '$k' is not a non-negative integer"
done
for opt in GPUS_PER_NODE NODES MAX_TOKENS; do
    need_positive_int "$opt" "${!opt}"
done
[[ -z "$UPDATE_FREQ" || "$UPDATE_FREQ" =~ ^[1-9][0-9]*$ ]] \
    || die "--update-freq must be a positive integer, got '$UPDATE_FREQ'"
[[ "$LAUNCHER" =~ ^(local|torchrun|slurm)$ ]] \
    || die "unknown --launcher '$LAUNCHER': choose local, torchrun or slurm"

if [[ -z "$PRECISION" ]]; then
    PRECISION=$DEFAULT_PRECISION
    if [[ $CPU == 1 ]]; then PRECISION=fp32; fi
fi
[[ "$PRECISION" =~ ^(fp32|fp16|bf16|amp)$ ]] \
    || die "unknown --precision '$PRECISION': choose fp32, fp16, bf16 or amp"
if [[ $CPU == 1 && ( $PRECISION == fp16 || $PRECISION == amp ) ]]; then
    die "--precision $PRECISION needs CUDA; with --cpu use fp32 (or bf16)"
fi

# ---- batch size: update_freq from the GPU count ----------------------------------------------
for e in "${EXTRA[@]+"${EXTRA[@]}"}"; do
    case "${e#+}" in
        dataset.max_tokens=*) die "set the batch with --max-tokens, not --extra $e (update_freq is computed from it)" ;;
        optimization.update_freq=*) die "set update_freq with --update-freq, not --extra $e" ;;
        distributed_training.distributed_world_size=*) die "the world size is --gpus-per-node x --nodes, not --extra $e" ;;
    esac
done

WORLD=$((GPUS_PER_NODE * NODES))
PER_UPDATE=$((MAX_TOKENS * WORLD))
if [[ -n "$UPDATE_FREQ" ]]; then
    EFFECTIVE=$((PER_UPDATE * UPDATE_FREQ))
    if (( EFFECTIVE != TOTAL_TOKENS )); then
        warn "--update-freq $UPDATE_FREQ gives $MAX_TOKENS x $UPDATE_FREQ x $WORLD GPU(s) =" \
            "$EFFECTIVE tokens per update; the paper's $BENCHMARK batch is $TOTAL_TOKENS"
    fi
else
    if (( TOTAL_TOKENS % PER_UPDATE != 0 )); then
        valid=()
        for ((g = 1; g <= TOTAL_TOKENS / MAX_TOKENS; g++)); do
            (( TOTAL_TOKENS % (MAX_TOKENS * g) == 0 )) && valid+=("$g")
        done
        hint="no --max-tokens fits $WORLD GPUs ($WORLD does not divide $TOTAL_TOKENS)"
        if (( TOTAL_TOKENS % WORLD == 0 )); then
            hint="or --max-tokens $((TOTAL_TOKENS / WORLD)) (update_freq 1) or another divisor of $((TOTAL_TOKENS / WORLD))"
        fi
        die "the paper's $BENCHMARK batch of $TOTAL_TOKENS tokens per update cannot be split" \
            "over $WORLD GPU(s) x --max-tokens $MAX_TOKENS (update_freq would be" \
            "$TOTAL_TOKENS / $PER_UPDATE, not an integer >= 1). Use a GPU count in {${valid[*]:-none}}" \
            "with --max-tokens $MAX_TOKENS, $hint; or force --update-freq N"
    fi
    UPDATE_FREQ=$((TOTAL_TOKENS / PER_UPDATE))
fi

# ---- launcher checks ---------------------------------------------------------------------------
TRAIN_BIN="$(command -v fairseq-hydra-train || true)"
if [[ -z "$TRAIN_BIN" ]]; then
    [[ $DRY_RUN == 1 ]] || die "'fairseq-hydra-train' not on PATH (activate the environment where fairseq is installed)"
    TRAIN_BIN=fairseq-hydra-train
fi
case "$LAUNCHER" in
    local)
        (( NODES == 1 )) || die "--launcher local runs on this node only; for --nodes $NODES use torchrun or slurm"
        if [[ $CPU == 1 ]] && (( WORLD > 1 )); then
            die "with --cpu and $WORLD processes use --launcher torchrun: fairseq's own launcher" \
                "spawns one process per CUDA device, and there are none"
        fi ;;
    torchrun)
        if (( NODES > 1 )) && [[ -z "$MASTER" ]]; then
            [[ $DRY_RUN == 1 ]] || die "--launcher torchrun with --nodes $NODES needs --master-addr HOST[:PORT] (the first node)"
            log "no --master-addr: the commands below read \$MASTER_ADDR, which must name the first node on" \
                "every node (a real run needs --master-addr)"
            MASTER='$MASTER_ADDR:29500'
        fi
        [[ -z "$MASTER" || "$MASTER" == *:* ]] || MASTER="$MASTER:29500"
        if [[ $DRY_RUN == 0 ]]; then
            command -v torchrun >/dev/null 2>&1 || die "'torchrun' not on PATH (it comes with torch)"
        fi ;;
    slurm)
        if [[ $DRY_RUN == 0 ]]; then
            command -v sbatch >/dev/null 2>&1 || die "'sbatch' not on PATH: --launcher slurm needs a SLURM login node (try --dry-run to see the script)"
        fi ;;
esac

abspath() { [[ "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
DATA="$(abspath "$DATA")"
SAVE_ROOT="$(abspath "$SAVE_ROOT")"
USER_DIR="$(abspath "$USER_DIR")"
# Hydra's quoted values take any character but these two: a backslash before a quote is an escape, and ${...}
# is an interpolation even inside quotes; fairseq reads a ':' in the data path as a list of data shards
for pair in "--data:$DATA" "--save-root:$SAVE_ROOT" "FAIRSEQ_RESIDUAL_USER_DIR:$USER_DIR"; do
    opt="${pair%%:*}" path="${pair#*:}"
    [[ "$path" != *\\* && "$path" != *'$'* ]] \
        || die "$opt $path: a path with a backslash or '\$' cannot be passed to fairseq-hydra-train (Hydra reads" \
               "them as an escape or an interpolation); use a path without them (a symbolic link will do)"
done
[[ "$DATA" != *:* ]] || die "--data $DATA: fairseq reads ':' in a data path as a list of data shards; use a" \
                            "path without ':' (a symbolic link will do)"
if [[ $DRY_RUN == 0 ]]; then
    [[ -d "$DATA" ]] || die "--data $DATA is not a directory"
    [[ -f "$USER_DIR/__init__.py" ]] || die "plugin not found at $USER_DIR (set FAIRSEQ_RESIDUAL_USER_DIR)"
fi

extra_sets() {  # extra_sets KEY: true if an --extra override assigns KEY
    local e
    for e in "${EXTRA[@]+"${EXTRA[@]}"}"; do
        [[ "$e" == "$1="* || "$e" == "+$1="* || "$e" == "++$1="* ]] && return 0
    done
    return 1
}

# iwslt14 / wmt14: the dictionaries and the training split, unless --extra changes the data or the languages
if [[ $DRY_RUN == 0 && $BENCHMARK != opus100 ]] && ! extra_sets task.data && ! extra_sets task.source_lang \
        && ! extra_sets task.target_lang && ! extra_sets dataset.train_subset; then
    read -r src tgt <<< "$(benchmark_langs "$BENCHMARK")"
    need_binarized "$DATA" "$src" "$tgt" train "$BENCHMARK"
fi

# OPUS-100: language list and pairs from the data directory (scripts/prepare-opus100.sh)
OPUS_OVERRIDES=()
if [[ $BENCHMARK == opus100 ]]; then
    for key in langs lang_pairs; do
        extra_sets "task.$key" && continue
        file="$DATA/$key.txt"
        if [[ -f "$file" ]]; then
            value="$(tr -d ' \n' < "$file")"
            OPUS_OVERRIDES+=("task.$key=[$value]")
        elif [[ $DRY_RUN == 1 ]]; then
            OPUS_OVERRIDES+=("@RAW@\"task.$key=[\$(cat $(quote_arg "$file"))]\"")
        else
            die "opus100 needs task.$key: $file is missing (scripts/prepare-opus100.sh writes it);" \
                "or pass --extra \"task.$key=[...]\""
        fi
    done
fi

# ---- command of one run -----------------------------------------------------------------------
is_complete_checkpoint() {  # torch.save writes a zip; a file cut short has no central directory
    local py
    py="$(command -v python || command -v python3)"
    "$py" -c 'import sys, zipfile; sys.exit(0 if zipfile.is_zipfile(sys.argv[1]) else 1)' "$1"
}

restore_override() {  # restore_override RUN_DIR: prints checkpoint.restore_file=... or nothing
    # fairseq writes checkpoint_last.pt by copying the checkpoint it has just saved (not
    # atomically): a run killed during that copy leaves a truncated checkpoint_last.pt, on which
    # resuming crashes. Then resume from the newest complete epoch/update checkpoint instead.
    local run_dir=$1 last="$1/checkpoint_last.pt" f
    [[ -f "$last" ]] || return 0
    is_complete_checkpoint "$last" && return 0
    for f in $(ls -t "$run_dir"/checkpoint[0-9]*.pt "$run_dir"/checkpoint_[0-9]*_[0-9]*.pt 2>/dev/null); do
        if is_complete_checkpoint "$f"; then
            warn "$last is incomplete (the run was killed while writing it): resuming from $f"
            echo "checkpoint.restore_file=$(hydra_value "$f")"
            return 0
        fi
    done
    die "$last is incomplete (the run was killed while writing it) and $run_dir has no other" \
        "complete checkpoint: move it away to restart the run from scratch"
}

build_command() {  # build_command SCHEME LAYERS SEED RUN_DIR -> CMD array
    local scheme=$1 layers=$2 seed=$3 run_dir=$4
    local ov=(
        "common.user_dir=$(hydra_value "$USER_DIR")"
        "task.data=$(hydra_value "$DATA")"
        "checkpoint.save_dir=$(hydra_value "$run_dir")"
        "hydra.run.dir=$(hydra_value "$run_dir")"
        "common.seed=$seed"
        "common.tensorboard_logdir=$(hydra_value "$run_dir/tensorboard")"
        "model.residual_scheme=$scheme"
        "model.encoder_layers=$layers"
        "model.decoder_layers=$layers"
        "dataset.max_tokens=$MAX_TOKENS"
        "optimization.update_freq=[$UPDATE_FREQ]"
    )
    case "$PRECISION" in
        fp32) ov+=(common.fp16=false common.memory_efficient_fp16=false common.bf16=false common.amp=false) ;;
        fp16) ov+=(common.fp16=true common.bf16=false common.amp=false)
              if [[ $scheme == resi_dual ]] && ! extra_sets model.resi_dual_scale; then
                  ov+=(model.resi_dual_scale=0.05)
              fi
              if [[ " $PER_PARAMETER_FP16 " == *" $scheme "* ]] && ! extra_sets common.fp16_no_flatten_grads \
                  && ! extra_sets common.memory_efficient_fp16; then
                  ov+=(common.fp16_no_flatten_grads=true)
              fi ;;
        bf16) ov+=(common.bf16=true common.fp16=false common.memory_efficient_fp16=false common.amp=false) ;;
        amp)  ov+=(common.amp=true common.fp16=false common.memory_efficient_fp16=false common.bf16=false) ;;
    esac
    if [[ $CPU == 1 ]]; then
        # fairseq's pytorch_ddp wrapper passes device_ids=[device_id], which torch refuses for
        # CPU modules: use fairseq's own all-reduce (legacy_ddp) on CPU
        ov+=(common.cpu=true distributed_training.distributed_backend=gloo
             distributed_training.ddp_backend=legacy_ddp)
    fi
    ov+=("distributed_training.distributed_world_size=$WORLD")
    case "$LAUNCHER" in
        torchrun)
            # one fairseq-hydra-train per process; rank and device from torchrun's environment
            ov+=(distributed_training.distributed_init_method=env://
                 distributed_training.distributed_no_spawn=true
                 'distributed_training.distributed_rank=${oc.env:RANK}'
                 'distributed_training.device_id=${oc.env:LOCAL_RANK}') ;;
        slurm)
            if [[ $CPU == 1 ]]; then
                # fairseq's own SLURM setup calls torch.cuda.set_device(SLURM_LOCALID) on every task
                # but the first of a node, which fails without CUDA: give the init method and the
                # rank explicitly (each srun task reads its own SLURM_PROCID), as for torchrun
                ov+=('@RAW@distributed_training.distributed_init_method=tcp://$MASTER_HOST:$PORT'
                     distributed_training.distributed_no_spawn=true
                     'distributed_training.distributed_rank=${oc.env:SLURM_PROCID}'
                     distributed_training.device_id=0)
            else
                # fairseq reads SLURM_* (rank = SLURM_PROCID, device = SLURM_LOCALID) and needs a port
                ov+=('@RAW@distributed_training.distributed_port=$PORT')
            fi ;;
    esac
    local restore
    restore="$(restore_override "$run_dir")"
    [[ -z "$restore" ]] || ov+=("$restore")
    ov+=("${OPUS_OVERRIDES[@]+"${OPUS_OVERRIDES[@]}"}")
    ov+=("${EXTRA[@]+"${EXTRA[@]}"}")

    CMD=()
    if [[ $LAUNCHER == torchrun ]]; then
        CMD+=(torchrun --nnodes "$NODES" --nproc_per_node "$GPUS_PER_NODE")
        if (( NODES == 1 )); then
            CMD+=(--standalone)
        else
            CMD+=(--rdzv_backend c10d --rdzv_id "$(basename "$run_dir")")
            if [[ "$MASTER" == '$MASTER_ADDR'* ]]; then
                CMD+=(--rdzv_endpoint "@RAW@\"$MASTER\"")
            else
                CMD+=(--rdzv_endpoint "$MASTER")
            fi
        fi
    fi
    CMD+=("$TRAIN_BIN" --config-dir "$CONFIG_DIR" --config-name "$CONFIG" "${ov[@]}")
}

sbatch_script() {  # sbatch_script RUN_DIR JOB_NAME: the sbatch file of the current CMD
    local run_dir=$1 job=$2 opt
    echo "#!/usr/bin/env bash"
    echo "# generated by scripts/train.sh; resubmitting it resumes from checkpoint_last.pt"
    echo "#SBATCH --job-name=$job"
    echo "#SBATCH --nodes=$NODES"
    echo "#SBATCH --ntasks-per-node=$GPUS_PER_NODE"
    [[ $CPU == 1 ]] || echo "#SBATCH --gpus-per-node=$GPUS_PER_NODE"
    echo "#SBATCH --output=$run_dir/slurm-%j.out"
    echo "#SBATCH --open-mode=append"
    for opt in $SLURM_OPTS; do echo "#SBATCH $opt"; done
    echo "set -euo pipefail"
    echo "cd $(printf '%q' "$PWD")"
    echo "PORT=\$((20000 + SLURM_JOB_ID % 20000))"
    [[ $CPU == 0 ]] || echo "MASTER_HOST=\$(scontrol show hostnames \"\$SLURM_JOB_NODELIST\" | head -n 1)"
    echo "srun --kill-on-bad-exit=1 $(quote_cmd "${CMD[@]}")"
}

# ---- the grid ---------------------------------------------------------------------------------
N_RUNS=$(( ${#SCHEME_LIST[@]} * ${#DEPTH_LIST[@]} * ${#SEED_LIST[@]} ))
log "$BENCHMARK ($CONFIG.yaml): $N_RUNS run(s); $NODES node(s) x $GPUS_PER_NODE GPU(s) = $WORLD" \
    "process(es), launcher $LAUNCHER, precision $PRECISION"
log "tokens per update: max_tokens $MAX_TOKENS x update_freq $UPDATE_FREQ x $WORLD GPU(s) =" \
    "$((PER_UPDATE * UPDATE_FREQ)) (paper: $TOTAL_TOKENS); update_freq = $UPDATE_FREQ"

FAILED=()
for scheme in "${SCHEME_LIST[@]}"; do
for layers in "${DEPTH_LIST[@]}"; do
for seed in "${SEED_LIST[@]}"; do
    run_name="${RUN_NAME//\{scheme\}/$scheme}"
    run_name="${run_name//\{layers\}/$layers}"
    run_name="${run_name//\{seed\}/$seed}"
    run_dir="$SAVE_ROOT/$BENCHMARK/$run_name"
    job="$BENCHMARK-$run_name"
    build_command "$scheme" "$layers" "$seed" "$run_dir"
    echo "# $BENCHMARK | $scheme | $layers+$layers layers | seed $seed -> $run_dir"
    if [[ $DRY_RUN == 0 ]]; then  # the run's training settings, recorded; a folder of other settings refused
        tools run-settings "$run_dir" "${CMD[@]}" || { FAILED+=("$run_name"); continue; }
    fi
    if [[ $LAUNCHER == slurm ]]; then
        script="$run_dir/train.sbatch"
        if [[ $DRY_RUN == 1 ]]; then
            echo "# --- $script ---"
            sbatch_script "$run_dir" "$job"
            echo "# ---"
            echo "sbatch $(printf '%q' "$script")"
        else
            mkdir -p "$run_dir"
            sbatch_script "$run_dir" "$job" > "$script"
            log "wrote $script"
            sbatch "$script" || FAILED+=("$run_name")
        fi
        continue
    fi
    line="$(quote_cmd "${CMD[@]}")"
    echo "$line"
    [[ $DRY_RUN == 1 ]] && continue
    mkdir -p "$run_dir"
    { echo "#!/usr/bin/env bash"; echo "# $(date -u +%FT%TZ) scripts/train.sh"; echo "cd $(printf '%q' "$PWD")"; echo "$line"; } \
        > "$run_dir/command.sh"
    [[ -f "$run_dir/checkpoint_last.pt" ]] && log "$run_name: resuming from $run_dir/checkpoint_last.pt"
    set +e
    "${CMD[@]}" 2>&1 | tee -a "$run_dir/train.log"
    status=${PIPESTATUS[0]}
    set -e
    if (( status != 0 )); then
        warn "$run_name failed (exit $status); log: $run_dir/train.log"
        FAILED+=("$run_name")
    fi
done
done
done

if (( ${#FAILED[@]} > 0 )); then
    die "${#FAILED[@]} of $N_RUNS run(s) failed: ${FAILED[*]}"
fi
