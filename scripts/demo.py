#!/usr/bin/env python3
"""German->English demo on the shipped Ding corpus (scripts/run_demo.sh runs it). Entry point of
:mod:`residual_studies.demo`; run with --help for the options.
"""
import sys

from residual_studies.demo import cli

if __name__ == "__main__":
    sys.exit(cli())
