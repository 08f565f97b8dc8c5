#!/usr/bin/env python3
"""Build data/ding-de-en from the Ding dictionary (data/README.md). Entry point of
:mod:`residual_studies.ding_corpus`; run with --help for the options.
"""
import sys

from residual_studies.ding_corpus import main

if __name__ == "__main__":
    sys.exit(main())
