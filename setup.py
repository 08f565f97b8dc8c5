"""fairseq-residual: Transformers with selectable residual schemes (Post-LN, Pre-LN, ResiDual, the other schemes
of the ResiDual paper's tables and those published after it) as a fairseq user-dir plugin.

The install ships the plugin alone (``fairseq_residual``, with ``analyze`` and its console script); the study
tooling (``scripts/residual_studies``) runs from the checkout."""
from setuptools import find_packages, setup

setup(
    name="fairseq-residual",
    version="0.1.0",
    description=(
        "A fairseq plugin (--user-dir fairseq_residual) registering the residual_transformer model with "
        "selectable residual schemes: Post-LN, Pre-LN, ResiDual (Xie et al. 2023, arXiv 2304.14802), the "
        "other schemes of that paper's tables and those published after it"
    ),
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",  # torch 2.13 requires it
    packages=find_packages(include=["fairseq_residual", "fairseq_residual.*"]),
    package_data={"fairseq_residual": ["paper_results.json"]},
    install_requires=[
        # fairseq 0.12.2 does not import on Python >= 3.11; fairseq-fixed 0.12.3.1 is a source release
        # of fairseq main with that fix. Build it with --no-build-isolation against the CPU torch
        # (the Makefile does this) or pip pulls a CUDA torch into the build environment.
        "fairseq==0.12.2; python_version < '3.11'",
        "fairseq-fixed==0.12.3.1; python_version >= '3.11'",
        "torch==2.13.0",
        "sacrebleu>=2.0",
        "sentencepiece>=0.1.97",
        "hydra-core>=1.0.7",
        "sacremoses>=0.0.53",
        "subword-nmt>=0.3.8",
        "matplotlib>=3.5",
        "scipy>=1.7",  # Student's t quantiles of the studies' intervals (fairseq-fixed pulls it in too)
        "tensorboardX>=2.5",
    ],
    # pytest < 9: pytest-xdist's --dist loadgroup (the Makefile's) renames item._nodeid, which pytest 9 no longer
    # reads, so that grouped tests are spread over the workers and their module fixtures built once per worker
    extras_require={"test": ["pytest>=7,<9", "pytest-xdist>=3"]},
    entry_points={
        "console_scripts": [
            "fairseq-residual-analyze = fairseq_residual.analyze:cli_main",
            "fairseq-residual-admin-profile = fairseq_residual.schemes.admin_profile:cli_main",
        ],
    },
    license="MIT",
)
