#!/usr/bin/env python3
"""Markdown tables of a grid of benchmark runs, shaped like the paper's. Entry point of
:mod:`residual_studies.results`; run with --help for the options.
"""
from residual_studies.results import main

if __name__ == "__main__":
    main()
