"""The speed benchmark's comparison: each plugin model against the stock ``transformer`` it is built on, as
the median over repetitions of the paired ratio (model / baseline measured in the same repetition), the
goals those ratios must meet, and the A/A noise of the run."""
import dataclasses
import json
import statistics

from fairseq_residual.schemes import SCHEMES

from .speed_harness import MODELS, STOCK_PRE, VARIANTS, summarize

#: Goals per plugin model, each scheme's own (``speed_goal`` of its class, :class:`SpeedGoal`): the smallest
#: ratio to the matching stock model (memory: the largest), for training throughput, peak training memory and
#: generation throughput. A scheme without a goal (the multi-stream ones) and its variants are not here: their
#: ratios are reported, not judged.
GOALS = {s.name: dataclasses.asdict(s.speed_goal) for s in SCHEMES if s.speed_goal is not None}
GOALS.update({name: GOALS[scheme] for name, (scheme, _) in VARIANTS.items() if scheme in GOALS})
METRICS = ("train", "memory", "generate")
#: the series behind each metric's ratio
METRIC_KEYS = dict(train="train_tokens_per_s", memory="peak_train_mem_bytes", generate="gen_sentences_per_s")
#: the plugin models whose ratios are an A/A comparison (fairseq's own layer code)
AA_MODELS = ("post_ln", "pre_ln")


def comparison(metric):
    """``<=`` for memory (a ceiling), ``>=`` for the throughputs (a floor)."""
    return "<=" if metric == "memory" else ">="


def goals_text(goals=None):
    """The goals as one line, schemes with the same goals together (``post_ln, pre_ln: train >= 0.99, ...``)."""
    groups = {}
    for name, g in (goals or GOALS).items():
        groups.setdefault(tuple(g.items()), []).append(name)
    return "; ".join(", ".join(names) + ": " + ", ".join(f"{m} {comparison(m)} {t}" for m, t in g)
                     for g, names in groups.items())


def models_summary(benches):
    """Per model: what it is (stock or plugin, architecture, scheme), its parameters, its baseline, the
    summary (median, min, max, n) and the samples of every series."""
    models = {}
    for b in benches:
        models[b.name] = dict(
            kind="stock transformer" if MODELS[b.name]["stock"] else "residual_transformer",
            arch=b.args.arch,
            residual_scheme=getattr(b.args, "residual_scheme", None),
            normalize_before=bool(b.args.encoder_normalize_before),
            resi_dual_scale=getattr(b.args, "resi_dual_scale", None) if b.name == "resi_dual" else None,
            params=b.params,
            baseline=MODELS[b.name]["baseline"],
            **{key: summarize(vals) for key, vals in b.series.items()},
            samples={key: vals for key, vals in b.series.items()},
        )
    return models


def paired_median(mine, theirs):
    """The median over repetitions of ``mine / theirs`` measured in the same repetition; None where either
    series is missing or incomplete."""
    if not mine or not theirs or len(mine) != len(theirs) or None in mine + theirs:
        return None
    return statistics.median([x / y for x, y in zip(mine, theirs)])


def training_time_ratios(path, baseline=STOCK_PRE):
    """``{model: its training time per target token / baseline's}`` from a speed benchmark's JSON (``--out``)
    of one shape: the inverse of the paired median throughput ratio, every model against the same
    ``baseline`` (default stock fairseq Pre-LN), whatever stock model its goals compare it with.

    Raises:
        ValueError: the file holds no shape or several (measure the one shape the ratios are for), or no
            training series of ``baseline``.
    """
    with open(path, encoding="utf-8") as f:
        shapes = json.load(f).get("shapes") or {}
    if len(shapes) != 1:
        raise ValueError(f"{path}: {len(shapes)} shapes ({', '.join(shapes) or 'none'}); the training time ratios are "
                         f"read from a speed benchmark run of one shape (--shapes NAME)")
    models = next(iter(shapes.values()))["models"]
    key = METRIC_KEYS["train"]
    theirs = (models.get(baseline) or {}).get("samples", {}).get(key)
    if not theirs:
        raise ValueError(f"{path}: no training series of {baseline}; add it to --models")
    ratios = {name: paired_median(m.get("samples", {}).get(key), theirs) for name, m in models.items()}
    return {name: 1.0 / r for name, r in ratios.items() if r}


def ratios_and_goals(series):
    """Paired ratios of every plugin model to its baseline, and the goals they meet.

    Args:
        series: ``{model: {series name: [value per repetition]}}``.

    Returns:
        ``(ratios, goals)``: ``ratios[model][metric]`` = ``{paired_median, of_medians}`` (None where a series
        is missing or incomplete) with ``baseline``; ``goals[model][metric]`` = ``{target, value, met,
        comparison}`` (``value`` and ``met`` None without a ratio).
    """
    ratios, goals = {}, {}
    for name, mine_all in series.items():
        base = MODELS[name]["baseline"]
        if base is None or base not in series:
            continue
        r = {}
        for metric, key in METRIC_KEYS.items():
            mine, theirs = mine_all[key], series[base][key]
            paired = paired_median(mine, theirs)
            r[metric] = None if paired is None else dict(
                paired_median=paired,
                of_medians=statistics.median(mine) / statistics.median(theirs),
            )
        ratios[name] = dict(baseline=base, **r)
        g = {}
        for metric, target in GOALS.get(name, {}).items():
            if r.get(metric) is None:
                g[metric] = dict(target=target, value=None, met=None)
                continue
            value = r[metric]["paired_median"]
            met = value <= target if metric == "memory" else value >= target
            g[metric] = dict(target=target, value=value, met=bool(met), comparison=comparison(metric))
        goals[name] = g
    return ratios, goals


def aa_noise(ratios):
    """The run's measurement noise: the largest ``|ratio - 1|`` of :data:`AA_MODELS` per throughput (their
    distance from 1 is noise, not plugin overhead), None without them."""
    noise = {}
    for metric in ("train", "generate"):
        devs = [abs(ratios[n][metric]["paired_median"] - 1.0) for n in AA_MODELS
                if n in ratios and ratios[n].get(metric)]
        noise[metric] = max(devs) if devs else None
    return noise
