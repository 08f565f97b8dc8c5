"""A non-editable install ships the plugin alone, and the study tooling, run from a checkout, uses it.

A fresh virtual environment (no pip, no packages of its own) sees the project environment's packages through
a ``.pth`` line naming that environment's site-packages: as a plain path, so none of the ``.pth`` files there
runs, and the editable install's finder of ``fairseq_residual`` stays inert. ``pip install --no-deps
--no-build-isolation`` (pip and setuptools from that path) builds a wheel of a copy of the checkout and
installs it into the fresh environment. From a second copy of the checkout, the demo's corpus check and the
depth study's ``--help`` and ``--dry-run`` then run with the fresh environment's Python: the ``--user-dir``
they use is the installed package's folder, never the copy's ``fairseq_residual``.
"""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import REPO, cli_env

pytestmark = pytest.mark.slow

IGNORE = shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", "build", ".pytest_cache", "runs",
                                "demo_out", "*.pt")


def _run(cmd, **kwargs):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=cli_env(), timeout=600,
                          **kwargs)
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(python, site-packages)`` of a fresh environment with a non-editable install of the project."""
    root = tmp_path_factory.mktemp("install")
    venv = root / "venv"
    assert _run([sys.executable, "-m", "venv", "--without-pip", venv]).returncode == 0
    python = venv / "bin" / "python"
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    with open(os.path.join(site, "project-packages.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=IGNORE)
    proc = _run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                 "--ignore-installed", "-q", source])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return python, site


def test_the_install_ships_the_plugin_alone(installed):
    python, site = installed
    plugin = os.path.join(site, "fairseq_residual")
    assert os.path.isfile(os.path.join(plugin, "paper_results.json"))
    assert os.path.isfile(os.path.join(plugin, "analyze", "cli.py"))
    for script in ("fairseq-residual-analyze", "fairseq-residual-admin-profile"):
        assert os.access(os.path.join(os.path.dirname(python), script), os.X_OK), script
    assert not os.path.exists(os.path.join(plugin, "tools"))
    assert not os.path.exists(os.path.join(site, "residual_studies"))
    where = _run([python, "-c", "import fairseq_residual; print(fairseq_residual.__file__)"], cwd="/")
    assert where.stdout.strip() == os.path.join(plugin, "__init__.py"), where.stderr[-2000:]


def test_the_tools_run_from_a_checkout_with_the_installed_plugin(installed, tmp_path, corpus_head):
    python, site = installed
    plugin = os.path.join(site, "fairseq_residual")
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO, checkout, ignore=IGNORE)
    scripts = checkout / "scripts"

    # the demo's corpus check: a missing file is named before any work
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus_head(40, 10, 10), corpus)
    (corpus / "valid.en").unlink()
    proc = _run([python, scripts / "demo.py", "--data", corpus, "--out", tmp_path / "demo"], cwd=tmp_path)
    assert proc.returncode == 2 and f"missing data file: {corpus / 'valid.en'}" in proc.stderr, proc.stderr
    assert not (tmp_path / "demo" / "data").exists()

    # a study: its help names the installed plugin as the --user-dir, and its commands pass it
    proc = _run([python, scripts / "depth_study.py", "--help"], cwd=tmp_path)
    assert proc.returncode == 0 and plugin in proc.stdout.replace("\n", "").replace(" ", ""), proc.stderr
    proc = _run([python, scripts / "depth_study.py", "--dry-run", "--data", corpus_head(40, 10, 10),
                 "--out", tmp_path / "study", "--schemes", "resi_dual", "--depths", "2", "--vocab-size", "100",
                 "--bleu-sentences", "5"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"--user-dir {plugin} " in proc.stdout
    assert str(checkout / "fairseq_residual") not in proc.stdout
