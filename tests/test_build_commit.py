"""Provenance is ours or none: the build step writes the checkout's commit into the package it builds (so a
``pip install .`` names it), and a package at the root of another repository never borrows its commit."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ksae_cupy import made_with

REPO = Path(__file__).resolve().parents[1]
PRINT = ("import json, ksae_cupy.made_with as p; "
         "print(json.dumps([str(p.PACKAGE_DIR), p.version_line(), p.provenance('cpu')['commit']]))")


def head(root: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def run_from(package_parent: Path, cwd: Path) -> list:
    """What the copy of the package under ``package_parent`` says of its code, run from ``cwd``."""
    import json

    done = subprocess.run([sys.executable, "-c", PRINT], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={"PYTHONPATH": str(package_parent), "PATH": "/usr/bin:/bin", "HOME": str(cwd)})
    assert done.returncode == 0, done.stderr
    where, line, commit = json.loads(done.stdout)
    assert Path(where) == package_parent / "ksae_cupy"
    return [line, commit]


def setup_module_of():
    spec = importlib.util.spec_from_file_location("ksae_setup", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() is not called
    return module


@pytest.mark.skipif(head(REPO) is None or not (REPO / ".git").exists(), reason="needs this package's git checkout")
def test_the_build_step_writes_the_commit_into_the_built_package(tmp_path):
    """``setup.py build_py`` (the step ``pip install .`` runs) into a folder of its own; the built copy, run
    where no git checkout holds it, names the commit it was built from, in --version and in config.json."""
    built = tmp_path / "build"
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(built)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = (built / "ksae_cupy" / "_build_commit.py").read_text()
    assert f"COMMIT = {head(REPO)!r}" in text
    (tmp_path / "elsewhere").mkdir()
    line, commit = run_from(built, tmp_path / "elsewhere")
    assert commit == head(REPO) and f"(commit {head(REPO)[:12]}" in line


def test_no_commit_is_written_outside_a_checkout_of_its_own(tmp_path):
    setup = setup_module_of()
    assert setup.build_commit_source(tmp_path) is None  # not a checkout
    (tmp_path / "repo" / "sub").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    assert setup.build_commit_source(tmp_path / "repo" / "sub") is None  # inside another repository


def test_a_garbled_build_commit_is_no_commit(monkeypatch):
    import types

    for commit in ("not a commit", 12, "g" * 40):
        module = types.ModuleType("ksae_cupy._build_commit")
        module.COMMIT, module.CLEAN = commit, True
        monkeypatch.setitem(sys.modules, "ksae_cupy._build_commit", module)
        assert made_with.built_commit() == (None, None)


@pytest.mark.parametrize("setup_cfg", [None, "[metadata]\nname = someone-elses\n"])
def test_a_package_at_the_root_of_another_repository_names_no_commit(tmp_path, setup_cfg):
    """The found case: the package copied to the top of another git repository reported that repository's
    commit as its own. The checkout must be ours: a setup.cfg that names ksae-cupy."""
    other = tmp_path / "theirs"
    shutil.copytree(REPO / "ksae_cupy", other / "ksae_cupy",
                    ignore=shutil.ignore_patterns("__pycache__", "_build_commit.py"))
    if setup_cfg is not None:
        (other / "setup.cfg").write_text(setup_cfg)
    git = ["git", "-C", str(other), "-c", "user.name=x", "-c", "user.email=x@x"]
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "theirs"], check=True)
    line, commit = run_from(other, tmp_path)
    assert commit is None and "commit" not in line
