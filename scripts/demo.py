#!/usr/bin/env python3
"""German->English demo on the shipped Ding corpus (scripts/run_demo.sh runs it). Entry point of
:mod:`fairseq_residual.tools.demo`; run with --help for the options.
"""
import sys

from fairseq_residual.tools.demo import cli

if __name__ == "__main__":
    sys.exit(cli())
