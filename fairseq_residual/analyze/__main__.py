"""``python -m fairseq_residual.analyze``: the ``fairseq-residual-analyze`` command."""
from .cli import cli_main

cli_main()
