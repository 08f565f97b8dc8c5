"""The argparse types of the tools' numeric and list options: each value is checked where it is parsed, so a
wrong one stops the tool with ``argument --NAME: ...`` (exit status 2) before anything is made.

Numbers must be finite and in their range (a learning rate above 0, dropout in [0, 1), ...); lists must not
name one item twice (``--seeds 1,1`` would count one run as two seeds).
"""
import argparse
import math


def _number(cast, text):
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def at_least(low, cast=int):
    """A number >= ``low``."""
    def check(text):
        value = _number(cast, text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
        return value
    check.__name__ = f"number >= {low}"
    return check


positive_int = at_least(1)
nonnegative_int = at_least(0)
nonnegative_float = at_least(0.0, float)


def positive_float(text):
    """A finite number > 0 (a learning rate)."""
    value = _number(float, text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def fraction(text):
    """A probability that leaves something: 0 <= p < 1 (dropout)."""
    value = _number(float, text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def unique(values, text):
    """``values`` when no item repeats, else the error naming the first repeated one."""
    seen = set()
    for v in values:
        if v in seen:
            raise argparse.ArgumentTypeError(f"{v} appears twice in {text!r}: each item counts once")
        seen.add(v)
    return values


def int_list(text):
    """Comma-separated positive integers, each once."""
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return unique(values, text)


def float_list(text):
    """Comma-separated finite numbers > 0, each once (a learning-rate grid)."""
    values = [positive_float(v) for v in text.replace(" ", "").split(",") if v]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    return unique(values, text)


def name_list(choices, what, everything=None, empty=False):
    """Comma-separated names from ``choices``, each once (``everything``: a word that means all of them;
    ``empty``: an empty list is allowed)."""
    def parse(text):
        if everything is not None and text.strip() == everything:
            return list(choices)
        values = [v for v in text.replace(" ", "").split(",") if v]
        bad = [v for v in values if v not in choices]
        if bad or not (values or empty):
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {','.join(bad) or repr(text)}: choose from "
                                             f"{', '.join(choices)}")
        return unique(values, text)
    parse.__name__ = f"{what} list"
    return parse



def _device(text, indexed):
    if text == "cpu":
        return text
    if text != "cuda" and not (indexed and text.startswith("cuda:") and text[5:].isdigit()):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda{', or cuda:N' if indexed else ''}, got {text!r}")
    import torch

    index = int(text[5:]) if ":" in text else 0
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"{text}: torch sees no such CUDA GPU on this machine (torch.cuda.is_available() is "
            f"{torch.cuda.is_available()}, {torch.cuda.device_count()} device(s), torch {torch.__version__}); "
            f"use --device cpu, or run on a machine with a GPU and a CUDA build of torch")
    return text


def device(text):
    """A torch device for the tools' ``--device``: ``cpu``, or ``cuda`` on a machine where torch sees a GPU;
    without one a run would silently train on the CPU and its report would say cuda."""
    return _device(text, indexed=False)


def indexed_device(text):
    """As :func:`device`, also ``cuda:N`` for the N-th GPU."""
    return _device(text, indexed=True)
