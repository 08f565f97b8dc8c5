#!/usr/bin/env python3
"""Markdown tables of a grid of benchmark runs, shaped like the paper's. Entry point of
:mod:`fairseq_residual.tools.results`; run with --help for the options.
"""
from fairseq_residual.tools.results import main

if __name__ == "__main__":
    main()
