#!/usr/bin/env python3
"""The shared corpus preparation steps of scripts/prepare-{iwslt14,wmt14-en-de,opus100}.sh
(``python scripts/prepare_corpus.py STEP ...``). Entry point of :mod:`residual_studies.corpus_steps`; run
with --help for the steps.
"""
import sys

from residual_studies.corpus_steps import main

if __name__ == "__main__":
    sys.exit(main())
