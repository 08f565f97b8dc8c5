#!/usr/bin/env python3
"""Speed and memory of residual_transformer against fairseq's stock transformer. Entry point of
:mod:`fairseq_residual.tools.speed`; run with --help for the options.
"""
from fairseq_residual.tools.speed import main

if __name__ == "__main__":
    main()
