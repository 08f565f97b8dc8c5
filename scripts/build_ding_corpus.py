#!/usr/bin/env python3
"""Build data/ding-de-en from the Ding dictionary (data/README.md). Entry point of
:mod:`fairseq_residual.tools.ding_corpus`; run with --help for the options.
"""
import sys

from fairseq_residual.tools.ding_corpus import main

if __name__ == "__main__":
    sys.exit(main())
