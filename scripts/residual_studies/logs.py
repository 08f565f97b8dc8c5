"""Reading what fairseq writes: the one parser of training logs and the one reader of
``fairseq-generate`` output.

Training logs: ``--log-format json`` lines of ``fairseq-train`` (``... | INFO | train_inner | {...}``)
and of ``fairseq-hydra-train`` (``[...][train_inner][INFO] - {...}``): ``train_inner`` (every
``--log-interval`` updates), ``train`` (end of epoch) and ``valid`` records, plus the parameter count.
"""
import json
import os
import re

_RECORD_RE = re.compile(
    r"(?:\| (?P<a>train_inner|train|valid) \| |\[(?P<b>train_inner|train|valid)\]\[[A-Z]+\] - )(?P<json>\{.*\})\s*$")
_PARAMS_RE = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")
KINDS = ("train_inner", "train", "valid")


def read_train_log(path):
    """The JSON records of a fairseq training log.

    Returns:
        dict: ``train_inner``, ``train``, ``valid`` (lists of dicts, in log order; the values as
        fairseq wrote them, often strings) and ``params`` (the model's parameter count, or None).
        A missing file gives empty lists.
    """
    out = {kind: [] for kind in KINDS}
    out["params"] = None
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _PARAMS_RE.search(line)
            if m:
                out["params"] = int(m.group(1).replace(",", ""))
                continue
            m = _RECORD_RE.search(line)
            if not m:
                continue
            try:
                out[m.group("a") or m.group("b")].append(json.loads(m.group("json")))
            except ValueError:
                continue
    return out


def number(value):
    """``float(value)``, or None for a missing or non-numeric value."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def loss_curves(path):
    """Loss curves of a training log.

    Returns:
        dict: ``train`` [(update, loss)], ``valid`` [(update, loss, nll_loss, ppl)] (loss = label-
        smoothed cross-entropy in bits per target token, fairseq's base 2), ``params`` (int or None).
        A resumed run logs some updates twice; the later entry wins.
    """
    log = read_train_log(path)
    train, valid = {}, {}
    for rec in log["train_inner"]:
        train[int(rec["num_updates"])] = float(rec["loss"])
    for rec in log["valid"]:
        valid[int(rec["valid_num_updates"])] = (float(rec["valid_loss"]), float(rec["valid_nll_loss"]),
                                                float(rec["valid_ppl"]))
    return dict(train=sorted(train.items()), valid=[(u, *v) for u, v in sorted(valid.items())],
                params=log["params"])


def _by_update(records, updates_key, value_key):
    """``{updates: value}`` of the records that have both numbers; a later record of the same update wins."""
    out = {}
    for rec in records:
        u, v = number(rec.get(updates_key)), number(rec.get(value_key))
        if u is not None and v is not None:
            out[int(u)] = v
    return out


def valid_nll_by_update(train_log, log=None):
    """``{updates: valid nll}`` from fairseq's validation records in a training log (bits per token); ``log``:
    the log already read (:func:`read_train_log`), or None to read it."""
    return _by_update((log or read_train_log(train_log))["valid"], "valid_num_updates", "valid_nll_loss")


def train_nll_by_update(train_log, log=None):
    """``{updates: training nll}`` from fairseq's ``train_inner`` records of a training log (bits per token, with
    dropout, each the mean over the ``--log-interval`` updates up to ``updates``); a resumed run logs some updates
    twice, and the later record wins. ``log`` as :func:`valid_nll_by_update`'s."""
    return _by_update((log or read_train_log(train_log))["train_inner"], "num_updates", "nll_loss")


def read_generate(path):
    """Parse ``fairseq-generate`` output.

    Returns:
        dict with ``hyps``, ``detok``, ``refs`` and ``sources`` ({sentence id: text}, from the
        ``H-``, ``D-``, ``T-`` and ``S-`` lines; the ``H-``/``D-`` text is the last tab field, after
        the score) and ``bleu_line`` (fairseq-generate's own final ``BLEU4 = ...`` line, or None).
    """
    out = {"hyps": {}, "detok": {}, "refs": {}, "sources": {}, "bleu_line": None}
    scored = {"H-": "hyps", "D-": "detok"}
    plain = {"T-": "refs", "S-": "sources"}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            tag = line[:2]
            if tag in scored or tag in plain:
                head, _, rest = line.partition("\t")
                try:
                    i = int(head[2:])
                except ValueError:
                    continue
                if tag in scored:
                    out[scored[tag]][i] = rest.split("\t")[-1] if "\t" in rest else ""
                else:
                    out[plain[tag]][i] = rest
            elif line.startswith("Generate ") and "BLEU" in line:
                out["bleu_line"] = line.strip()
    return out
