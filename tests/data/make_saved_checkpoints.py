"""Write ``tests/data/saved_checkpoints.pt.gz``: one tiny trained-layout model per registered scheme, as the code of
the commit that ran this saved it (its state dict, with every LayerNorm and scheme parameter randomised), with
the log-probabilities it computes on a fixed batch and the hypotheses of a beam search, so that
``tests/test_saved_checkpoints.py`` can prove that later code loads those state dicts and computes the same.

Run from the repository root: ``python tests/data/make_saved_checkpoints.py`` (it refuses to overwrite)."""
import gzip
import io
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from conftest import build_model, make_dictionary, random_batch  # noqa: E402

#: the model every scheme is saved at: 3 encoder and 2 decoder layers (N != M), width 8, 2 heads
SHAPE = ["--encoder-layers", 3, "--decoder-layers", 2, "--encoder-embed-dim", 8, "--decoder-embed-dim", 8,
         "--encoder-ffn-embed-dim", 16, "--decoder-ffn-embed-dim", 16, "--encoder-attention-heads", 2,
         "--decoder-attention-heads", 2]
OUT = HERE / "saved_checkpoints.pt.gz"  # gzip: the zip archive of a state dict is mostly per-tensor records


def scheme_flags(scheme):
    from references import REFERENCES

    return ["--residual-scheme", scheme, *REFERENCES[scheme][0], *SHAPE]


def randomise(model, seed):
    """Non-trivial LayerNorm and scheme parameters (as the conformance suite randomises them)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "residual" in name:
                p.add_(0.3 * torch.randn_like(p))


def outputs(model, d):
    """``(log-probabilities B x T x V of the fixed batch, beam-search hypotheses [(tokens, score)])``."""
    from fairseq.sequence_generator import SequenceGenerator

    src, lengths, prev, _ = random_batch(d, bsz=3)
    with torch.no_grad():
        lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        gen = SequenceGenerator([model], d, beam_size=2, max_len_a=0, max_len_b=6, min_len=1)
        hyps = gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    return lp, [[(h["tokens"].tolist(), float(h["score"])) for h in sent] for sent in hyps]


def main():
    from fairseq_residual.schemes import SCHEME_NAMES

    if OUT.exists():
        sys.exit(f"{OUT} exists: it records the layout of the code that wrote it; not overwriting")
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    d = make_dictionary(12)
    saved = {"commit": commit, "schemes": {}}
    for i, scheme in enumerate(SCHEME_NAMES):
        torch.manual_seed(100 + i)
        model, _, _ = build_model("residual_transformer_tiny", *scheme_flags(scheme), dictionary=d)
        randomise(model, 200 + i)
        lp, hyps = outputs(model, d)
        saved["schemes"][scheme] = {"model": model.state_dict(), "log_probs": lp, "hypotheses": hyps}
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    OUT.write_bytes(gzip.compress(buffer.getvalue(), 9))
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes) at {commit}")


if __name__ == "__main__":
    main()
