#!/usr/bin/env python3
"""Speed and memory of residual_transformer against fairseq's stock transformer. Entry point of
:mod:`residual_studies.speed`; run with --help for the options.
"""
from residual_studies.speed import main

if __name__ == "__main__":
    main()
