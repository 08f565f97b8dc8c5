#!/usr/bin/env python3
"""Training speed and peak memory of one fairseq-train run, in-process. Entry point of
:mod:`residual_studies.measure_training`; run with --help for the options.
"""
from residual_studies.measure_training import main

if __name__ == "__main__":
    main()
