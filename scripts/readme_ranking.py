#!/usr/bin/env python3
"""README.md's ranking table from the archived ranking.json: checks it (exit status 1 when it differs) or, with
--write, rewrites it. Entry point of :mod:`residual_studies.readme_ranking`."""
import sys

from residual_studies import readme_ranking

if __name__ == "__main__":
    sys.exit(readme_ranking.main())
