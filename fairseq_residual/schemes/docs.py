"""The scheme tables of README.md and docs/schemes.md, and the options and presets tables of docs/usage.md, generated from the
registry and the presets' code: one home for every scheme fact.

Each scheme's formulas, initialisation, sources, recipe and fp16 advice are attributes of its class
(:class:`~fairseq_residual.schemes.base.ResidualScheme`), its options are its :attr:`OPTIONS`, and what it
refuses is what its code refuses: :func:`refusals` builds a small model of every scheme with each fairseq
option of :data:`PROBES` through fairseq's own parser and registry and records which builds fail. The
tables are written between marker lines of the pages of :data:`PAGES` (README.md: the scheme table, what a
user chooses from; docs/schemes.md: each scheme's recommended training and what it accepts of fairseq's options,
which grow by a paragraph and a wide row per scheme; docs/usage.md: every option, and the ``--arch`` presets)::

    <!-- BEGIN generated: schemes -->
    ...
    <!-- END generated: schemes -->

``python -m fairseq_residual.schemes`` prints the scheme table; ``python -m fairseq_residual.schemes
--write-readme README.md`` rewrites every block of README.md and of the other pages, found beside it;
``--check README.md`` exits 1 when a block differs (``tests/test_readme.py`` runs the same check).
"""
import copy
import functools
import os
import re
from typing import Dict, List, Tuple

from . import DEFAULT_SCHEME, SCHEME_NAMES, SCHEMES

#: the command that rewrites the blocks (named in the check's message)
WRITE_COMMAND = "python -m fairseq_residual.schemes --write-readme README.md"

#: fairseq options whose build is tried for every scheme: (column, the options as shown, the attributes they
#: set on the parsed ``fairseq-train`` arguments; NormFormer's ``scale_*``, which fairseq's legacy
#: ``transformer`` parser does not offer, reach a model through ``--model-overrides`` or Hydra)
PROBES = (
    ("layerdrop", "--*-layerdrop", {"encoder_layerdrop": 0.1, "decoder_layerdrop": 0.1}),
    ("layerdrop", "--*-layers-to-keep", {"encoder_layers_to_keep": "0", "decoder_layers_to_keep": "0"}),
    ("sublayer", "--cross-self-attention", {"cross_self_attention": True}),
    ("sublayer", "scale_attn", {"scale_attn": True}),
    ("sublayer", "scale_fc", {"scale_fc": True}),
    ("sublayer", "scale_heads", {"scale_heads": True}),
    ("sublayer", "scale_resids", {"scale_resids": True}),
    ("other", "--*-normalize-before", {"encoder_normalize_before": True, "decoder_normalize_before": True}),
    ("other", "--layernorm-embedding", {"layernorm_embedding": True}),
    ("other", "--no-cross-attention", {"no_cross_attention": True}),
    ("other", "--no-decoder-final-norm", {"no_decoder_final_norm": True}),
    ("other", "--quant-noise-pq", {"quant_noise_pq": 0.1}),
    ("fp16", "--fp16", {"fp16": True}),
    ("fp16", "--bf16", {"bf16": True}),
    ("fp16", "--fp16 --weight-decay", {"fp16": True, "weight_decay": 1e-4}),
)


def _cell(text: str) -> str:
    """A table cell: no line breaks, ``|`` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if text else "-"


def _table(header: List[str], rows: List[List[str]], align: List[str] = None) -> List[str]:
    align = align or ["---"] * len(header)
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"] + [
        "| " + " | ".join(_cell(c) for c in row) + " |" for row in rows
    ]


def _name(scheme) -> str:
    return f"`{scheme.name}`" + (" (default)" if scheme.name == DEFAULT_SCHEME else "")


def scheme_table() -> List[str]:
    """(a) name, update rule, stack output, initialisation, source and reference code of every scheme."""
    rows = [[_name(s), _code(s.update), _code(s.output), s.init or "-",
             f"{s.source}; {s.reference}" if s.reference else s.source] for s in SCHEMES]
    return _table(["scheme (`--residual-scheme`)", "update per sub-layer", "stack output",
                   "initialisation after fairseq's", "source; reference code"], rows)


def _default(option) -> str:
    if option.default_text:
        return f"`{option.default_text}`" if option.default_text.startswith("--") else option.default_text
    if option.type is bool:
        return f"`{option.flag if option.default else option.negative}`"
    return f"`{option.default}`"


def _range(option) -> str:
    if option.type is bool:
        return f"`{option.flag}` or `{option.negative}`"
    if option.choices:
        return ", ".join(f"`{c}`" for c in option.choices)
    if option.type is str:
        return "a path" if option.metavar == "FILE" else "a string"
    kind = "integer" if option.type is int else "number"
    return f"{kind} in `{option.range_text()}`"


def options_table() -> List[str]:
    """(b) ``--residual-scheme``, ``--norm`` and its options, and every scheme option: its Hydra key, range and
    default."""
    from ..norms import NORM_OPTIONS, OPTION_NORM

    rows = [["`--residual-scheme` (`model.residual_scheme`)", "all", ", ".join(f"`{n}`" for n in SCHEME_NAMES),
             f"`{DEFAULT_SCHEME}`, or the `--arch` preset's", "where LayerNorm and the residual connection go"]]
    for o in NORM_OPTIONS:
        flag = f"`{o.flag} {o.metavar}`" if o.metavar else f"`{o.flag}`"
        owner = f"all, with `--norm {OPTION_NORM[o.dest]}`" if o.dest in OPTION_NORM else "all"
        rows.append([f"{flag} (`model.{o.dest}`)", owner, _range(o), _default(o), o.help])
    for s in SCHEMES:
        options = list(s.OPTIONS)
        while options:
            o = options.pop(0)
            pair = options[0] if options and _stack_pair(o, options[0]) else None
            flag = f"`{o.flag}` / `{o.negative}`" if o.type is bool else f"`{o.flag} {o.metavar}`" if o.metavar else f"`{o.flag}`"
            if pair is None:
                rows.append([f"{flag} (`model.{o.dest}`)", f"`{s.name}`", _range(o), _default(o), o.help])
                continue
            options.pop(0)
            rows.append([f"{flag} / `{pair.flag} {pair.metavar}` (`model.{o.dest}`, `model.{pair.dest}`)",
                         f"`{s.name}`", _range(o), _default(o), o.help.replace("encoder", "encoder / decoder")])
    first = {}  # a meaning several schemes' options share (torch.compile's), written out once
    for row in rows:
        flag = row[0].split("`")[1]
        if row[4] in first:
            row[4] = f"as `{first[row[4]]}`"
        else:
            first[row[4]] = flag
    return _table(["option (Hydra key)", "scheme", "range", "default", "meaning"], rows)


def _stack_pair(o, other) -> bool:
    """``o`` an ``encoder_*`` option and ``other`` its ``decoder_*`` twin (the same kind, range, default and
    meaning but for the stack's name): one row of the options table for the two."""
    return (o.dest.startswith("encoder_") and other.dest == "decoder_" + o.dest[len("encoder_"):]
            and o.type is not bool and o.metavar and o.metavar == other.metavar
            and (_range(o), _default(o)) == (_range(other), _default(other))
            and o.help.replace("encoder", "decoder") == other.help)


def recipes() -> List[str]:
    """(c) recommended training per scheme, and the project's reading of the encoder-decoder case."""
    lines = []
    for s in SCHEMES:
        if not s.recipe and not s.reading:
            continue
        text = s.recipe
        if s.reading:
            text += f" *Encoder-decoder (the project's reading):* {s.reading}."
        lines.append(f"* `{s.name}`: " + " ".join(text.split()))
    return lines


@functools.lru_cache(maxsize=None)
def refusals() -> Dict[str, Dict[str, List[str]]]:
    """``{scheme: {column: [options shown, ...]}}``: the probes whose build fails.

    Each probe builds ``residual_transformer_tiny`` (2+2 layers) of the scheme, parsed as ``fairseq-train``
    parses it, with the probe's attributes set, and runs the check fairseq's Trainer runs on the same settings
    (:func:`fairseq_residual.training_checks.check_training`); a ``ValueError`` of either is a refusal. No data,
    no process: about 10 ms a build.
    """
    import logging

    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationTask

    from ..training_checks import check_training, namespace_config

    d = Dictionary()
    for i in range(8):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    quiet = logging.getLogger("fairseq_residual")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    found = {}
    try:
        for s in SCHEMES:
            found[s.name] = {}
            parsed = options.parse_args_and_arch(options.get_training_parser(), [
                "/nonexistent-data", "--arch", "residual_transformer_tiny", "--task", "translation",
                "--residual-scheme", s.name, "--encoder-layers", "2", "--decoder-layers", "2"])
            for column, shown, attributes in PROBES:
                args = copy.deepcopy(parsed)
                for key, value in attributes.items():
                    setattr(args, key, value)
                try:
                    check_training(namespace_config(args), TranslationTask(args, d, d).build_model(args))
                except ValueError:
                    found[s.name].setdefault(column, []).append(shown)
    finally:
        quiet.setLevel(level)
    return found


def _flags(entries) -> str:
    return ", ".join(f"`{f}`" for f in entries)


def norm_cell(scheme) -> str:
    """What ``--norm`` the scheme takes: all, or which it refuses and why (:attr:`norm_refusals`), and the
    norms of its formula that ``--norm`` leaves."""
    from ..norms import NORMS

    if not scheme.has_layer_norm:
        text = "`layernorm` only: it has no LayerNorm to replace"
    else:
        by_reason: Dict[str, List[str]] = {}
        for norm in NORMS:
            if norm in scheme.norm_refusals:
                by_reason.setdefault(scheme.norm_refusals[norm], []).append(norm)
        text = "; ".join(f"refused ({', '.join(f'`{n}`' for n in norms)}): {reason}"
                         for reason, norms in by_reason.items()) or "all"
    return text + (f"; kept: {scheme.formula_norms}" if scheme.formula_norms else "")


def compat_table() -> List[str]:
    """(d) what each scheme accepts of fairseq's ``transformer`` options, as its code checks them."""
    found = refusals()
    every = {c: [shown for column, shown, _ in PROBES if column == c] for c, _, _ in PROBES}
    rows = []
    for s in SCHEMES:
        f = found[s.name]
        drop, sub, fp16 = f.get("layerdrop", []), f.get("sublayer", []), f.get("fp16", [])
        if "--fp16" in fp16:  # implied
            fp16 = [flag for flag in fp16 if not flag.startswith("--fp16 ")]
        rows.append([
            _name(s),
            "yes" if not drop else f"refused ({_flags(drop)}): {s.no_layerdrop_reason}",
            ("as fairseq (its own layers)" if s.fairseq_path else "yes") if not sub else
            "refused: they change fairseq's sub-layer code" if sub == every["sublayer"] else f"refused ({_flags(sub)})",
            _flags(f.get("other", [])) or "none",
            norm_cell(s),
            "yes",
            "yes",
            "; ".join(filter(None, ["refused: " + _flags(fp16) if fp16 else "", s.fp16_advice])),
        ])
    return _table(["scheme", "layer-drop, pruning", "`--cross-self-attention`, NormFormer (`scale_*`)",
                   "other options refused", "`--norm`", "TorchScript", "`--retain-dropout-modules`", "fp16 / bf16"], rows)


def presets_table() -> List[str]:
    """(e) every architecture preset of ``fairseq_residual/model.py`` (``--arch``), with the settings it gives a
    model when the command line sets none: each preset function applied to an empty namespace, as fairseq
    applies it (``fairseq.models.ARCH_CONFIG_REGISTRY``)."""
    import argparse

    from ..model import MODEL_NAME, PRESETS, residual_tiny

    presets = dict(PRESETS, **{f"{MODEL_NAME}_tiny": residual_tiny})
    rows = []
    for name, preset in presets.items():
        a = argparse.Namespace()
        preset(a)
        shared = ("all (encoder, decoder, output)" if a.share_all_embeddings else
                  "decoder input and output" if a.share_decoder_input_output_embed else "none")
        source = " ".join((preset.__doc__ or "").split()).split(". ")[0].rstrip(".").replace("``", "`")
        rows.append([f"`{name}`", f"{a.encoder_layers}+{a.decoder_layers}",
                     f"{a.encoder_embed_dim} / {a.encoder_ffn_embed_dim} / {a.encoder_attention_heads}",
                     f"{a.dropout:g} / {a.attention_dropout:g} / {a.activation_dropout:g}", shared,
                     f"{a.resi_dual_scale:g}", source])
    return _table(["preset (`--arch`)", "layers", "width / FFN / heads", "dropout / attention / activation",
                   "shared embeddings", "ResiDual's c (`--resi-dual-scale`)", "source"], rows,
                  ["---", "---:", "---:", "---:", "---", "---:", "---"])


#: block name -> its generator
BLOCKS = {"schemes": scheme_table, "options": options_table, "recipes": recipes, "compat": compat_table,
          "presets": presets_table}


def block(name: str) -> str:
    return "\n".join(BLOCKS[name]()) + "\n"


def _pattern(name: str):
    return re.compile(rf"(<!-- BEGIN generated: {name} -->\n)(.*?)(<!-- END generated: {name} -->)", re.S)


#: page (relative to the checkout's root, where README.md is) -> the blocks it holds
PAGES = {"README.md": ("schemes",), os.path.join("docs", "schemes.md"): ("recipes", "compat"),
         os.path.join("docs", "usage.md"): ("options", "presets")}


def render(text: str, names=tuple(BLOCKS)) -> str:
    """``text`` (a page) with its generated blocks ``names`` rewritten.

    Raises:
        ValueError: a block's markers are missing.
    """
    for name in names:
        pattern = _pattern(name)
        if not pattern.search(text):
            raise ValueError(f"no '<!-- BEGIN generated: {name} -->' ... '<!-- END generated: {name} -->' block")
        text = pattern.sub(lambda m: m.group(1) + block(name) + m.group(3), text, count=1)
    return text


def stale_blocks(text: str, names=tuple(BLOCKS)) -> List[str]:
    """The names among ``names`` of the blocks of ``text`` that differ from what the registry generates."""
    stale = []
    for name in names:
        m = _pattern(name).search(text)
        if m is None or m.group(2) != block(name):
            stale.append(name)
    return stale


def pages(readme: str) -> List[Tuple[str, Tuple[str, ...]]]:
    """Every generated page as (path, its block names), the paths resolved against the directory of
    ``readme`` (the path of README.md)."""
    root = os.path.dirname(os.path.abspath(readme))
    return [(os.path.join(root, page) if page != "README.md" else readme, names) for page, names in PAGES.items()]
