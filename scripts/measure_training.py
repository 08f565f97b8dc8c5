#!/usr/bin/env python3
"""Training speed and peak memory of one fairseq-train run, in-process. Entry point of
:mod:`fairseq_residual.tools.measure`; run with --help for the options.
"""
from fairseq_residual.tools.measure import main

if __name__ == "__main__":
    main()
