"""The Python the shell scripts need, as sub-commands (``python -m residual_studies.shell CMD`` with
``scripts/`` on the path; ``tools CMD`` in ``scripts/lib.sh``):

  scheme-names                 the registered residual schemes, space separated, in table order
  config-values NAME           tokens per update, default precision and depth of configs/NAME.yaml
  plugin-dir                   the folder of the fairseq_residual that Python imports (for --user-dir)
  train-defaults NAME          five lines, one start-up: config-values NAME; the run directory name
                               pattern ({scheme}-{layers}L-seed{seed}); plugin-dir; scheme-names; the
                               schemes whose parameters carry their own optimizer settings (fairseq's
                               optim_overrides), which fairseq's flat --fp16 master copy cannot hold
  count-sentences PREFIX...    sentences of each binarized split, one line each (empty when unknown)
  eval-meta BENCH RUN_DIR NAME CKPT AVERAGE_LOG SUBSET BEAM LENPEN MAX_LEN_A MAX_LEN_B DATA [NEWSTEST REFS]
                               the evaluation's metadata (JSON) for score_bleu.py --meta; AVERAGE_LOG:
                               average_checkpoints.py's output (its indented lines name the averaged
                               checkpoints), or empty when no checkpoint was averaged; NEWSTEST: the
                               newstest2010-2016 decoding settings (JSON, or null) and REFS their references
  speed-summary OUT DTYPE...   the goals summary of the speed benchmark's bench_<dtype>.json files
  checkpoint-langs CKPT         the source and target language a checkpoint's task was trained with ("SRC TGT";
                               empty when it does not say, e.g. a multilingual task)
  checkpoint-fits-run CKPT NAME
                               refuse (exit status 1, the reason) a checkpoint whose model is of another scheme,
                               encoder depth or seed than the run directory NAME ({scheme}-{layers}L-seed{seed}) names
  run-settings RUN_DIR OVERRIDE...
                               record the run's training settings (:func:`run_settings`) in RUN_DIR, or refuse
                               (exit status 1, the differences and the fix) when RUN_DIR holds a checkpoint of a
                               run started with other settings
"""
import json
import os
import struct
import sys

from . import PLUGIN_DIR
from .commands import RUN_NAME, parse_run_name


def scheme_names():
    """The registered schemes' names, space-separated, read from the plugin's ``schemes/registry_order.py``
    by its path (importing the plugin would load torch and fairseq: 3.5 s of every train.sh call)."""
    import importlib.util
    import os

    path = os.path.join(PLUGIN_DIR, "schemes", "registry_order.py")
    spec = importlib.util.spec_from_file_location("fairseq_residual_registry_order", path)
    order = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(order)
    return " ".join(order.SCHEME_MODULES)


def config_values(name):
    from .commands import config_values as values

    v = values(name)
    return f"{v['tokens_per_update']} {v['precision']} {v['depth']}"


def optim_override_schemes():
    """The registered schemes whose class sets a non-empty ``optim_overrides`` (per-parameter optimizer settings,
    :class:`fairseq_residual.schemes.base.ResidualScheme`), space-separated. Read from the scheme modules' source
    by their paths, without importing them (torch and fairseq: 3.5 s of every train.sh call): an assignment
    ``optim_overrides = "..."`` in a class body. ``tests/test_train_script.py`` checks it against the registry."""
    import ast
    import os

    found = []
    for name in scheme_names().split():
        with open(os.path.join(PLUGIN_DIR, "schemes", name + ".py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "optim_overrides"
                                                        for t in stmt.targets):
                    if isinstance(stmt.value, ast.Constant) and stmt.value.value:
                        found.append(name)
    return " ".join(dict.fromkeys(found))


def count_sentences(prefix):
    """Sentences of the binarized split ``prefix`` (``.idx``/``.bin``)."""
    with open(prefix + ".idx", "rb") as f:
        head = f.read(26)
    if head[:9] == b"MMIDIDX\x00\x00":  # fairseq's mmap index: magic, version <Q, dtype <B, count <Q
        return struct.unpack("<Q", head[18:26])[0]
    from fairseq.data import data_utils

    return len(data_utils.load_indexed_dataset(prefix, None))


def averaged_checkpoints(average_log):
    """The checkpoints average_checkpoints.py names in its log (its lines indented by two spaces)."""
    with open(average_log, encoding="utf-8") as f:
        return [line.strip() for line in f if line.startswith("  ")]


def eval_meta(bench, run_dir, name, ckpt, average_log, subset, beam, lenpen, a, b, data, newstest="null",
              refs=""):
    newstest = json.loads(newstest)
    if newstest:
        newstest["references"] = refs
    averaged = averaged_checkpoints(average_log) if average_log else None
    run = parse_run_name(name)
    return json.dumps({
        "benchmark": bench, "run_dir": run_dir, "run": run, "data": data,
        "checkpoint": {"path": ckpt, "averaged": averaged},
        "subset": subset,
        "generation": {"beam": int(beam), "lenpen": float(lenpen), "max_len_a": float(a),
                       "max_len_b": int(b), "required_batch_size_multiple": 1},
        **({"newstest_average_generation": newstest} if newstest else {}),
    })


def _saved_sections(path, *sections):
    """A getter ``get(key, default)`` per name of ``sections``: the checkpoint's saved ``cfg.<section>`` (``task``,
    ``model``, ``common``), or its legacy ``args``. Loads the file once, with ``mmap`` where its format allows
    (the tensors are not read), else whole.

    Raises:
        ValueError: the file is empty or truncated (naming the complete checkpoints beside it), no checkpoint torch
            can read (another format), or one without saved settings (a bare ``state_dict``), in one line."""
    from fairseq_residual.checkpoint_safety import check_not_truncated, read_checkpoint_structure, unreadable_reason

    try:  # empty or cut short by a kill: say so, and name the complete ones beside it
        check_not_truncated(path, "evaluate a complete one (--checkpoint best, last or a file)")
    except Exception as exc:  # noqa: BLE001 - TruncatedCheckpointError, a missing file: one line
        raise ValueError(str(exc)) from None
    try:
        state = read_checkpoint_structure(path)
    except Exception as exc:  # noqa: BLE001 - whatever torch says, one line for the shell scripts
        raise ValueError(f"cannot read the checkpoint {path} ({unreadable_reason(exc)}): is it a "
                         f"complete fairseq checkpoint?") from None
    if not isinstance(state, dict):
        raise ValueError(f"cannot read the checkpoint {path}: it holds no fairseq checkpoint (a "
                         f"{type(state).__name__})")
    cfg = state.get("cfg")
    if cfg is None and state.get("args") is None:  # nothing to compare: not "a post_ln model" by default
        raise ValueError(f"cannot read the checkpoint {path}: it saved no settings (no cfg or args; a bare "
                         f"state_dict?): evaluate a checkpoint that fairseq-train saved")

    def getter(section):
        part = cfg.get(section) if isinstance(cfg, dict) else getattr(cfg, section, None) if cfg is not None else None
        part = part if part is not None else state.get("args")
        return part.get if isinstance(part, dict) else (lambda key, default=None: getattr(part, key, default))

    return [getter(section) for section in sections]


def checkpoint_langs(path):
    """``"SRC TGT"`` of the checkpoint's translation task (its saved ``cfg.task``, or the legacy ``args``), "" when
    it names none."""
    get, = _saved_sections(path, "task")
    src, tgt = get("source_lang", None), get("target_lang", None)
    return f"{src} {tgt}" if src and tgt else ""


def checkpoint_fits_run(path, name):
    """Why the checkpoint ``path`` is not of the run directory ``name`` (``{scheme}-{layers}L-seed{seed}``): its
    model's residual scheme (a stock fairseq transformer's: post_ln or pre_ln, by ``encoder_normalize_before``),
    encoder depth or training seed (``common.seed``) differs from the name's; "" when they agree (what the
    checkpoint does not record is not compared), or when ``name`` is not a run name."""
    run = parse_run_name(name)
    if run is None:
        return ""
    get, common = _saved_sections(path, "model", "common")
    scheme = get("residual_scheme", None) or ("pre_ln" if get("encoder_normalize_before", False) else "post_ln")
    layers = get("encoder_layers", None)
    seed = common("seed", None)
    if scheme == run["scheme"] and (layers is None or int(layers) == run["layers"]) and (
            seed is None or int(seed) == run["seed"]):
        return ""
    held = f"a {scheme} model" + (f" with {layers} encoder layers" if layers is not None else "") + (
        f", seed {seed}" if seed is not None else "")
    return (f"{path} holds {held}, but the run directory {name} is {run['scheme']} with {run['layers']} layers, "
            f"seed {run['seed']}: its results would be filed under the wrong run; pass the --run-dir that checkpoint "
            f"was trained in, or a checkpoint of this run")


#: the Hydra keys that define what a run trains (a prefix ending in '.' takes a group, one ending in '=' one key):
#: a run resumed with another value of one of them would be neither run; launch keys (paths, GPUs, logging,
#: max_update, save intervals) and the loss scaler's start (restored from the checkpoint) may change
TRAINING_KEYS = ("model.", "optimizer.", "optimization.lr=", "optimization.clip_norm=", "lr_scheduler.", "criterion.",
                 "common.seed=", "common.fp16=", "common.bf16=", "common.amp=", "common.memory_efficient_fp16=",
                 "common.memory_efficient_bf16=", "task.source_lang=", "task.target_lang=")
RUN_SETTINGS = "run_settings.json"


def run_settings(overrides):
    """What defines a run's training, from its Hydra overrides (``key=value``, the last of a key wins, ``+`` and
    ``++`` ignored): every override of :data:`TRAINING_KEYS`, and the tokens per update, ``dataset.max_tokens`` x
    ``optimization.update_freq`` x ``distributed_training.distributed_world_size`` (its GPUs and update_freq may
    change, its batch may not). Returns ``{key: value}``."""
    given = {}
    for o in overrides:
        key, sep, value = o.lstrip("+").partition("=")
        if sep:
            given[key] = value
    out = {k: v for k, v in given.items() if (k + "=").startswith(TRAINING_KEYS)}
    try:
        tokens = (int(given["dataset.max_tokens"]) * int(given.get("optimization.update_freq", "[1]").strip("[]"))
                  * int(given.get("distributed_training.distributed_world_size", "1")))
        out["tokens per update"] = str(tokens)
    except (KeyError, ValueError):
        pass
    return out


def check_run_settings(run_dir, overrides):
    """Record :func:`run_settings` in ``run_dir/run_settings.json``, or return why not (None when recorded): a
    checkpoint in ``run_dir`` of a run whose recorded settings differ (starting would resume it with these)."""
    path = os.path.join(run_dir, RUN_SETTINGS)
    now = run_settings(overrides)
    before = None
    try:
        with open(path, encoding="utf-8") as f:
            before = json.load(f)
    except FileNotFoundError:
        pass
    resumable = any(n.startswith("checkpoint") and n.endswith(".pt") for n in os.listdir(run_dir))
    if before is not None and before != now and resumable:
        changed = [f"{k}: {before.get(k, '(not set)')} -> {now.get(k, '(not set)')}"
                   for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
        return (f"{run_dir} holds a run started with other training settings ({'; '.join(changed)}): starting would "
                f"resume that run with these. Resume it with its own settings, or train these in a folder of their "
                f"own (another --save-root)")
    tmp = f"{path}.{os.getpid()}.tmp"  # one per process: every node of a multi-node run writes it
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(now, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cmd, args = (argv[0], argv[1:]) if argv else (None, [])
    if cmd == "scheme-names" and not args:
        print(scheme_names())
    elif cmd == "config-values" and len(args) == 1:
        try:
            print(config_values(args[0]))
        except (FileNotFoundError, KeyError, ValueError) as e:
            sys.exit(f"config-values: {e}")
    elif cmd == "plugin-dir" and not args:
        print(PLUGIN_DIR)
    elif cmd == "train-defaults" and len(args) == 1:
        try:
            print(config_values(args[0]), RUN_NAME, PLUGIN_DIR, scheme_names(), optim_override_schemes(), sep="\n")
        except (FileNotFoundError, KeyError, ValueError) as e:
            sys.exit(f"train-defaults: {e}")
    elif cmd == "count-sentences" and args:
        for prefix in args:
            try:
                print(count_sentences(prefix))
            except Exception:  # unknown: the scorer then does without the expected count
                print()
    elif cmd == "eval-meta" and len(args) in (11, 13):
        print(eval_meta(*args))
    elif cmd == "checkpoint-langs" and len(args) == 1:
        try:
            print(checkpoint_langs(args[0]))
        except ValueError as e:
            sys.exit(str(e))
    elif cmd == "checkpoint-fits-run" and len(args) == 2:
        try:
            why = checkpoint_fits_run(*args)
        except ValueError as e:
            why = str(e)
        if why:
            sys.exit(why)
    elif cmd == "run-settings" and args:
        os.makedirs(args[0], exist_ok=True)
        why = check_run_settings(args[0], args[1:])
        if why:
            sys.exit(f"[train] ERROR: {why}")
    elif cmd == "speed-summary" and args:
        from .speed_report import print_gpu_summary

        print_gpu_summary(args[0], args[1:])
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
