#!/usr/bin/env python3
"""Average the last N checkpoints of a run (scripts/evaluate.sh runs it). Entry point of
:mod:`residual_studies.checkpoints`; run with --help for the options.
"""
import sys

from residual_studies.checkpoints import cli

if __name__ == "__main__":
    sys.exit(cli())
