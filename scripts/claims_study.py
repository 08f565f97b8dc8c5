#!/usr/bin/env python3
"""The claims study: the ResiDual paper's warm-up and depth claims, schemes (default Post-LN, Pre-LN,
ResiDual; --schemes all) x conditions x seeds on the shipped corpus, or with --learning-curve where BLEU stops
moving (scripts/claims_study.sh runs it). Entry point of :mod:`residual_studies.claims_study` and
:mod:`residual_studies.learning_curve` (Python puts this folder, scripts/, first on the path); run with
--help for the options.
"""
import sys

from residual_studies import claims, claims_study, learning_curve


def main(argv=None):
    args = claims.parse_args(argv)
    return (learning_curve if args.learning_curve else claims_study).main(args)


if __name__ == "__main__":
    sys.exit(main())
