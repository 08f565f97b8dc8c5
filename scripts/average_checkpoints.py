#!/usr/bin/env python3
"""Average the last N checkpoints of a run (scripts/evaluate.sh runs it). Entry point of
:mod:`fairseq_residual.tools.checkpoints`; run with --help for the options.
"""
import sys

from fairseq_residual.tools.checkpoints import cli

if __name__ == "__main__":
    sys.exit(cli())
