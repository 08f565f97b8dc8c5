"""The ResiDual paper's reported BLEU (Xie et al. 2023, arXiv 2304.14802), as one data file.

``paper_results.json`` beside this module holds every number of the paper's IWSLT14 De-En, WMT En-De and
OPUS-100 tables and of its warm-up ablation, keyed by benchmark (``scripts/train.sh --benchmark`` names),
registry scheme name and layers per stack. The numbers were transcribed from two agreeing secondary
transcriptions of the paper, not from its PDF: every table that shows them says so. ``"fail"`` marks a run
the paper reports as diverged. Not imported by the plugin (``--user-dir`` loads nothing of this).
"""
import json
import os
from functools import lru_cache
from typing import Optional, Union

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_results.json")
FAIL = "fail"


@lru_cache(maxsize=1)
def load() -> dict:
    """The whole data file as a dict (``source`` and ``benchmarks``)."""
    with open(PATH, encoding="utf-8") as f:
        return json.load(f)


def paper_bleu(benchmark: str, scheme: str, layers: int, warmup: bool = True,
               direction: Optional[str] = None) -> Optional[Union[float, str]]:
    """The paper's BLEU for ``scheme`` at ``layers`` + ``layers`` layers on ``benchmark``.

    Args:
        benchmark: ``iwslt14``, ``wmt14`` or ``opus100``.
        scheme: registry name (``post_ln``, ``resi_dual``, ...).
        layers: layers per stack.
        warmup: False for the paper's no-warm-up ablation (IWSLT14 only).
        direction: a column of the benchmark's per-direction table (OPUS-100: ``en-xx``, ``xx-en``, ``all``);
            None: its main table.

    Returns:
        the BLEU (float), ``"fail"`` where the paper reports divergence, or None where the paper has
        no such cell.
    """
    bench = load()["benchmarks"].get(benchmark)
    if bench is None:
        return None
    if direction is not None:
        return bench.get("by_direction", {}).get(scheme, {}).get(str(layers), {}).get(direction)
    table = bench["results"] if warmup else bench.get("no_warmup", {})
    return table.get(scheme, {}).get(str(layers))


def describe(benchmark: str) -> Optional[str]:
    """One line naming the paper's table, its BLEU type and the transcription caveat, or None."""
    bench = load()["benchmarks"].get(benchmark)
    if bench is None:
        return None
    return f"Paper: {bench['table']}, {load()['source']}. Paper's BLEU type: {bench['bleu_type']}."
