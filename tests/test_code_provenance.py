"""What made a result: __version__, --version on every command, provenance in config.json and checkpoints."""
import configparser
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

import ksae_cupy
from ksae_cupy import made_with

REPO = Path(__file__).resolve().parents[1]


def setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return parser


def test_version_is_setup_cfgs():
    assert ksae_cupy.__version__ == setup_cfg()["metadata"]["version"]
    assert "__version__" in ksae_cupy.__all__ and "__version__" in dir(ksae_cupy)


def test_every_command_answers_version_with_the_commit(tmp_path):
    commit, clean = made_with.code_commit()
    if made_with.PACKAGE_DIR.parent == REPO:  # run from this checkout: its commit
        assert commit is not None and len(commit) == 40
    else:  # an installed copy (CI's): the commit its build wrote into it, if it was built from a checkout
        assert (commit, clean) == made_with.built_commit()
    said = f"ksae-cupy {ksae_cupy.__version__}" + (
        "" if commit is None else f" (commit {commit[:12]}, {'clean' if clean else 'uncommitted changes'})")
    scripts = setup_cfg()["options.entry_points"]["console_scripts"].split("\n")
    entries = [line.split("=") for line in scripts if line.strip()]
    assert len(entries) == 9
    for name, target in entries:  # each as its console script runs it: the entry point's callable, on sys.argv
        name, (module, attribute) = name.strip(), target.strip().split(":")
        script = f"import sys; sys.argv[0] = {name!r}; from {module} import {attribute}; sys.exit({attribute}())"
        done = subprocess.run([sys.executable, "-c", script, "--version"], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)  # not the source tree: the package the tests import
        assert done.returncode == 0, (name, done.stderr)
        assert done.stdout == f"{name}: {said}\n"


def test_outside_a_checkout_or_without_git_the_commit_is_the_builds_or_none(monkeypatch, tmp_path):
    # Without git (or outside the package's checkout) the commit is the one written when the package was built
    # (an installed copy: pip install .), else none; never another repository's.
    built = made_with.built_commit()
    made_with.code_commit.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on the path
    try:
        assert made_with.code_commit() == built
        record = made_with.provenance("cpu")
        assert record["commit"] == built[0] and record["clean"] == built[1]
        assert record["version"] == ksae_cupy.__version__
        if built[0] is None:
            assert made_with.version_line() == f"ksae-cupy {ksae_cupy.__version__}"
        else:
            assert built[0][:7] in made_with.version_line()
    finally:
        made_with.code_commit.cache_clear()
    monkeypatch.setattr(made_with, "PACKAGE_DIR", tmp_path / "ksae_cupy")  # a copy outside this checkout
    (tmp_path / "ksae_cupy").mkdir()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    try:
        assert made_with.code_commit() == built
    finally:
        made_with.code_commit.cache_clear()


def test_the_record_names_libraries_without_importing_cupy():
    record = made_with.provenance("cpu")
    assert record["numpy"] == np.__version__ and record["h5py"] == h5py.__version__
    assert record["python"].count(".") == 2 and record["cpu"] and record["gpu"] is None
    assert set(record) == {"package", "version", "commit", "clean", "python", "numpy", "scipy", "h5py", "numba",
                           "cupy", "cpu", "gpu"}
    assert "cupy" not in sys.modules or record["cupy"] is not None


def train(args):
    from ksae_cupy.cli.train import train_command

    result = CliRunner().invoke(train_command, [*args, "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def test_run_folders_and_checkpoints_record_their_code_and_a_resume_adds_its_own(tmp_path):
    from ksae_cupy.training.checkpoint import load_checkpoint

    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((200, 8)).astype(np.float32))
    run = tmp_path / "run"
    train([str(tmp_path / "x.npy"), "--hidden", "12", "--k", "3", "--epochs", "1", "--batch-size", "20",
           "--device", "cpu", "--threads", "1", "--run-dir", str(run)])
    now = made_with.provenance("cpu")
    config = json.loads((run / "config.json").read_text())
    assert config["provenance"] == {"created_by": now, "last_run_by": now}
    assert load_checkpoint(run / "checkpoint.h5").provenance == now
    with h5py.File(run / "checkpoint.h5", "r") as f:
        assert json.loads(f.attrs["provenance"]) == now  # a plain attribute other tools read

    older = {**now, "version": "0.0.1", "commit": "0" * 40, "numpy": "1.23.0"}
    config["provenance"]["created_by"] = older  # as if another version of the code had started the run
    (run / "config.json").write_text(json.dumps(config))
    train(["--resume", str(run), "--epochs", "2"])  # never refused for it
    resumed = json.loads((run / "config.json").read_text())["provenance"]
    assert resumed == {"created_by": older, "last_run_by": now}

    del config["provenance"]  # a run started before provenance was recorded
    (run / "config.json").write_text(json.dumps(config))
    train(["--resume", str(run), "--epochs", "3"])
    assert json.loads((run / "config.json").read_text())["provenance"] == {"created_by": None, "last_run_by": now}


@pytest.mark.parametrize("device, expected", [("cpu", None), (None, None)])
def test_no_gpu_name_without_a_gpu(device, expected):
    assert made_with.gpu_name(device) == expected


def test_the_package_code_is_clean_while_only_results_in_the_tree_changed(monkeypatch, tmp_path):
    # A re-evaluation rewrites tracked eval.json files: the code that ran is still the commit's.
    package = tmp_path / "ksae_cupy"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = ksae-cupy\n")  # the package's own checkout
    (tmp_path / "eval.json").write_text("{}\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        subprocess.run([*git, *args], cwd=tmp_path, check=True)
    monkeypatch.setattr(made_with, "PACKAGE_DIR", package)
    made_with.code_commit.cache_clear()
    try:
        (tmp_path / "eval.json").write_text('{"test_error": 0.02}\n')
        assert made_with.code_commit()[1] is False and made_with.package_code_clean() is True
        (tmp_path / "setup.cfg").write_text("[metadata]\nname = ksae-cupy\nversion = 2\n")
        assert made_with.package_code_clean() is False
        (tmp_path / "setup.cfg").write_text("[metadata]\nname = ksae-cupy\n")
        (package / "a.py").write_text("x = 2\n")
        assert made_with.package_code_clean() is False
    finally:
        made_with.code_commit.cache_clear()
