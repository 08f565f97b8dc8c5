"""``python -m fairseq_residual.schemes``: the registry's tables.

    python -m fairseq_residual.schemes                          # the scheme table (Markdown)
    python -m fairseq_residual.schemes --table options          # schemes, options, recipes, compat or presets
    python -m fairseq_residual.schemes --write-readme README.md # rewrite the generated blocks of README.md, docs/schemes.md and docs/usage.md
    python -m fairseq_residual.schemes --check README.md        # exit 1 when a block differs

The tables are built by :mod:`fairseq_residual.schemes.docs` from the schemes' attributes and options and
from what their code refuses.
"""
import argparse
import sys

from .docs import BLOCKS, WRITE_COMMAND, block, pages, render, stale_blocks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_residual.schemes", description=__doc__.split("\n")[0])
    parser.add_argument("--table", choices=tuple(BLOCKS) + ("all",), default="schemes",
                        help="the table to print (default: schemes)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write-readme", metavar="README",
                       help="rewrite the generated blocks of this README and of the pages beside it (docs/schemes.md, docs/usage.md)")
    group.add_argument("--check", metavar="README",
                       help="exit 1 when a generated block of this README or of the pages beside it differs")
    args = parser.parse_args(argv)
    if args.write_readme or args.check:
        status = 0
        for path, names in pages(args.write_readme or args.check):
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                new = render(text, names)
            except (OSError, ValueError) as exc:
                parser.error(f"{path}: {exc}")
            if args.check:
                stale = stale_blocks(text, names)
                if stale:
                    print(f"{path}: generated blocks differ from the registry: {', '.join(stale)}; run "
                          f"{WRITE_COMMAND}", file=sys.stderr)
                    status = 1
                else:
                    print(f"{path}: every generated block matches the registry")
                continue
            if new != text:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
            print(f"{path}: generated blocks {'rewritten' if new != text else 'already up to date'}")
        return status
    names = tuple(BLOCKS) if args.table == "all" else (args.table,)
    sys.stdout.write("\n".join(block(n) for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
