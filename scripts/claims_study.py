#!/usr/bin/env python3
"""The claims study: the ResiDual paper's warm-up and depth claims, schemes (default Post-LN, Pre-LN,
ResiDual; --schemes all) x conditions x seeds on the shipped corpus (scripts/claims_study.sh runs it). Entry point of
:mod:`fairseq_residual.tools.claims`; run with --help for the options.
"""
import sys

from fairseq_residual.tools.claims import main

if __name__ == "__main__":
    sys.exit(main())
