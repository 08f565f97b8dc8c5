#!/usr/bin/env python3
"""BLEU of fairseq-generate output as each benchmark's literature reports it. Entry point of
:mod:`residual_studies.bleu`; run with --help for the options.
"""
import sys

from residual_studies.bleu import cli

if __name__ == "__main__":
    sys.exit(cli())
