"""Admin's profile as a file: the reference's ``profile.ratio.init`` format ("k r" per line, encoder
k = 1..2N then decoder k = 1..3M), read for ``--admin-profile FILE`` (:func:`read_profile`), written
(:func:`write_profile`), exported from a checkpoint of an Admin model (:func:`export_profile`) by the command
line ``fairseq-residual-admin-profile CHECKPOINT [OUT]`` (:func:`main`, a console script of the install;
``python -m fairseq_residual.schemes.admin`` runs the same, with runpy's warning that the package imported the
module first). The profile in the model, and how it is measured, is
:mod:`.admin`'s.
"""
import math
import os
import sys
from typing import List

import torch

from .base import STACKS, SchemeOptions
from ..user_errors import MissingFileError, SettingError


def _depth_of(ks: List[int]) -> str:
    """Describe the model a list of profile indices belongs to ('6 encoder and 6 decoder layers')."""
    runs, run = [], 0
    for k in ks:
        if k == 1 and run:
            runs.append(run)
            run = 0
        run += 1
    runs.append(run)
    if len(runs) == 2 and runs[0] % 2 == 0 and runs[1] % 3 == 0:
        return f"{runs[0] // 2} encoder and {runs[1] // 3} decoder layers"
    return "indices " + ", ".join(f"1..{n}" for n in runs)


def read_profile(path: str, encoder_layers: int, decoder_layers: int):
    """Read a profile in the reference's ``profile.ratio.init`` format: UTF-8 text, one "k r" line per
    sub-layer (k an integer index, r a finite ratio > 0), encoder k = 1..2N, then decoder k = 1..3M.

    Returns:
        ``(encoder ratios [2N], decoder ratios [3M])``, lists of floats.

    Raises:
        FileNotFoundError: no such file, naming the fix.
        ValueError: a malformed line (not two fields, an index that is not a finite integer, a ratio that
            is not a finite number > 0, bytes that are not text), a binary file (e.g. a checkpoint passed
            by mistake), an empty file, or a profile of another depth (wrong number of lines or indices),
            naming the file, the line and the fix.
    """
    n_enc, n_dec = 2 * encoder_layers, 3 * decoder_layers
    fix = (
        "drop --admin-profile (the first training batch then profiles the model), or pass the profile "
        f"of a {encoder_layers}+{decoder_layers}-layer model (write one from a checkpoint with "
        "fairseq-residual-admin-profile CHECKPOINT OUT)"
    )
    if not os.path.isfile(path):
        raise MissingFileError(f"--admin-profile {path}: no such file; {fix}")
    ks, rs = [], []
    with open(path, "rb") as f:  # bytes: a binary file is named as such, with its line, not UnicodeDecodeError
        if f.read(4) == b"PK\x03\x04":  # a zip archive: what torch.save writes
            raise SettingError(
                f"--admin-profile {path} is a checkpoint (a zip archive), not a profile: write its profile "
                f"with fairseq-residual-admin-profile {path} profile.ratio.init and pass "
                f"--admin-profile profile.ratio.init, or {fix}"
            )
        f.seek(0)
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SettingError(
                    f"--admin-profile {path} line {lineno} is not text (byte {raw[exc.start]:#04x} at column "
                    f"{exc.start + 1} is not UTF-8): a profile is the text 'k r' per line; is it a binary "
                    f"file? {fix}"
                ) from None
            if not line.strip():
                continue
            fields = line.split()
            try:
                k, r = float(fields[0]), float(fields[1])
                if len(fields) != 2 or not math.isfinite(k) or k != int(k):
                    raise ValueError
            except (ValueError, IndexError):
                raise SettingError(
                    f"--admin-profile {path} line {lineno}: expected 'k r' (sub-layer index, an integer, and "
                    f"its ratio), got {line.strip()!r}; {fix}"
                ) from None
            if not (math.isfinite(r) and r > 0):
                raise SettingError(
                    f"--admin-profile {path} line {lineno}: ratio {r!r} must be finite and > 0; {fix}"
                )
            ks.append(int(k))
            rs.append(r)
    if not ks:
        raise SettingError(f"--admin-profile {path} is empty: it has no 'k r' line; {fix}")
    expected = list(range(1, n_enc + 1)) + list(range(1, n_dec + 1))
    if ks != expected:
        raise SettingError(
            f"--admin-profile {path} does not fit this model: it has {len(ks)} lines ({_depth_of(ks)}) but "
            f"a model of {encoder_layers} encoder and {decoder_layers} decoder layers needs {n_enc + n_dec} "
            f"(encoder k = 1..{n_enc}, then decoder k = 1..{n_dec}); it was profiled at another depth: {fix}"
        )
    return rs[:n_enc], rs[n_enc:]


def write_profile(path: str, encoder_ratios, decoder_ratios):
    """Write a profile in the reference's ``profile.ratio.init`` format ("k r" lines)."""
    with open(path, "w") as f:
        for ratios in (encoder_ratios, decoder_ratios):
            for k, r in enumerate(ratios, 1):
                f.write(f"{k} {float(r)!r}\n")


def export_profile(checkpoint: str, out: str) -> None:
    """Write the profile saved in an Admin checkpoint to ``out`` (``profile.ratio.init`` format).

    Raises:
        FileNotFoundError: no such checkpoint.
        fairseq_residual.checkpoint_safety.TruncatedCheckpointError: the checkpoint is empty or cut short,
            naming its size and the complete checkpoints beside it.
        ValueError: the checkpoint is not of an Admin model, or was saved before it was profiled.
        EOFError, RuntimeError, pickle.UnpicklingError, KeyError: not a fairseq checkpoint (``torch.load``'s
            own errors; :func:`main` names the file).
    """
    import fairseq_residual  # noqa: F401  (allow-lists fairseq's checkpoint globals)
    from fairseq_residual.checkpoint_safety import check_not_truncated, folder_message

    if os.path.isdir(checkpoint):
        raise SettingError(folder_message(checkpoint, "CHECKPOINT"))
    if os.path.isdir(out):
        raise SettingError(f"OUT {out} is a folder: name the profile file to write, e.g. "
                           f"{os.path.join(out, 'profile.ratio.init')}")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise SettingError(f"OUT {out} is in a folder that does not exist, {parent}: create it (mkdir -p {parent}) "
                           f"or name a file in an existing folder")
    check_not_truncated(checkpoint, "export the profile from a complete checkpoint of the run")

    from .admin import SCHEME  # the scheme's module imports this one

    state = torch.load(checkpoint, map_location="cpu")["model"]
    for stack in STACKS:  # checkpoints of earlier versions of this plugin
        SCHEME.upgrade_state_dict(state, f"{stack}.", stack, SchemeOptions("admin"))
    if "encoder.residual.profile" not in state:
        from fairseq_residual.checkpoint_safety import trained_scheme

        theirs = trained_scheme(state)
        raise SettingError(f"{checkpoint} is not a checkpoint of a --residual-scheme admin model"
                         f"{f' (its encoder scheme: {theirs})' if theirs else ''}: pass one that fairseq-train "
                         f"--residual-scheme admin wrote")
    if not (int(state["encoder.residual.profiled"]) and int(state["decoder.residual.profiled"])):
        raise SettingError(f"{checkpoint} was saved before its first training batch: it has no profile yet")
    write_profile(out, state["encoder.residual.profile"].tolist(), state["decoder.residual.profile"].tolist())


def main(argv=None):
    """``fairseq-residual-admin-profile CHECKPOINT [OUT]``: export an Admin checkpoint's profile.

    Returns 0 when OUT was written or ``--help`` printed; 2 for a usage error (argparse's message on stderr); 1, after one ``error: ...`` line on stderr naming
    the checkpoint and the fix, when it is missing, empty or truncated, not a fairseq checkpoint, not of an
    Admin model or not yet profiled (no traceback).
    """
    import pickle
    import re

    from fairseq_residual.checkpoint_safety import TruncatedCheckpointError

    import argparse

    parser = argparse.ArgumentParser(
        prog="fairseq-residual-admin-profile",
        description="Write the profile saved in a checkpoint of a --residual-scheme admin model in the "
        "reference's profile.ratio.init format ('k r' per sub-layer), for --admin-profile FILE.",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint fairseq-train wrote, e.g. "
                        "checkpoints/checkpoint_last.pt")
    parser.add_argument("out", metavar="OUT", nargs="?", default="profile.ratio.init",
                        help="the profile to write (default: %(default)s)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, after argparse's message on stderr)
        return e.code
    checkpoint, out = args.checkpoint, args.out
    try:
        export_profile(checkpoint, out)
    except (OSError, ValueError, TruncatedCheckpointError) as e:  # each names the file and the fix
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (EOFError, RuntimeError, KeyError, TypeError, AttributeError, pickle.UnpicklingError) as e:
        # torch.load's reason, without its advice to load unsafely (weights_only=False)
        unpickler = re.search(r"WeightsUnpickler error:\s*([^\n]+?)(?:\.\s|\n|$)", str(e))
        reason = unpickler.group(1) if unpickler else (str(e).strip().splitlines() or [""])[0][:300]
        print(f"error: {checkpoint} cannot be read as a fairseq checkpoint ({type(e).__name__}: {reason}): pass "
              f"a checkpoint that fairseq-train --residual-scheme admin wrote (e.g. its checkpoint_last.pt)",
              file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def cli_main():
    """The console script ``fairseq-residual-admin-profile``: :func:`main` with the command line's arguments."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
