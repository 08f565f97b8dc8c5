#!/usr/bin/env python3
"""Depth-scaling study: schemes x depths on the Ding corpus (scripts/depth_study.sh runs it). Entry
point of :mod:`residual_studies.depth_study`; run with --help for the options.
"""
import sys

from residual_studies.depth_study import main

if __name__ == "__main__":
    sys.exit(main())
