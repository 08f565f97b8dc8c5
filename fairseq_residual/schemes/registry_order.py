"""The registry's schemes, in its order, by module name: ``schemes/<name>.py`` defines the scheme registered
as ``<name>`` (``fairseq_residual.schemes`` checks that each module's scheme carries its module's name).

This file imports nothing, so that a tool that only needs the names (the shell scripts' option checks,
``scripts/residual_studies/shell.py``) can read it by its path without loading torch and fairseq (3.5 s).
To add a scheme, add its module name here: first the eight of the ResiDual paper's tables (Xie et al. 2023,
arXiv 2304.14802, tables 1-2) in their order, then the schemes published after it.
"""

SCHEME_MODULES = (
    "post_ln",
    "pre_ln",
    "deepnorm",
    "admin",
    "t_fixup",
    "dlcl",
    "b2t",
    "resi_dual",
    "peri_ln",
    "mix_ln",
    "lns",
    "rezero",
    "hybrid_norm",
    "hyper_connections",
    "mhc",
    "siamese_norm",
    "denseformer",
    "value_residual",
    "laurel",
    "reordered_norm",
    "attn_res",
    "muddformer",
    "depth_mup",
    "mhc_lite",
    "frac_connections",
    "ngpt",
)
