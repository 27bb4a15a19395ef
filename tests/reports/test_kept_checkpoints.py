"""Checkpoints kept in git history, out of the tree (results/checkpoints.json): ``ksae-data restore-checkpoint``
puts one back, its SHA-256 checked, from a full clone or a shallow one; a mismatch writes nothing. Each test makes
a small git repository of its own: a committed checkpoint, then removed and listed in the manifest."""
from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy.cli.data import data_command
from ksae_cupy.errors import KsaeError
from ksae_cupy.reports import paper_tables
from ksae_cupy.reports.folders import clear_unstarted, read_metrics, run_state
from ksae_cupy.reports.kept_checkpoints import MANIFEST, entry_for, keep, read_manifest, write_manifest
from ksae_cupy.session.runs import RunFolder

RUN = "results/runs/a"
CHECKPOINT = f"{RUN}/checkpoint.h5"
DATA = bytes(range(256)) * 40  # the "checkpoint": any bytes do, git does not look inside


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture(autouse=True)
def git_identity(monkeypatch, tmp_path):
    for key in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(key, "test")
    for key in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(key, "test@example.org")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above tmp_path is found


@pytest.fixture
def repo(tmp_path) -> Path:
    """A repository whose second commit removed the checkpoint its first committed, and listed it."""
    root = tmp_path / "origin"
    (root / RUN).mkdir(parents=True)
    git(root, "init", "-q")
    (root / CHECKPOINT).write_bytes(DATA)
    (root / RUN / "config.json").write_text(json.dumps({"kind": "ksae-train", "train": {"epochs": 10}}))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "a run with its checkpoint")
    write_manifest(root, [entry_for(root, CHECKPOINT)])
    git(root, "rm", "-q", CHECKPOINT)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "the checkpoint out of the tree")
    return root


def restore(cwd: Path, *args: str, monkeypatch):
    monkeypatch.chdir(cwd)
    return CliRunner().invoke(data_command, ["restore-checkpoint", *args], catch_exceptions=False)


def test_the_manifest_names_the_commit_that_holds_the_file(repo):
    [entry] = read_manifest(repo)
    assert entry.path == CHECKPOINT and entry.bytes == len(DATA)
    assert entry.sha256 == hashlib.sha256(DATA).hexdigest()
    assert entry.commit == git(repo, "rev-parse", "HEAD~1").strip()  # the last commit that had it


def test_restores_a_checkpoint_into_place_and_checks_it(repo, monkeypatch):
    result = restore(repo, RUN, monkeypatch=monkeypatch)  # its run folder names it too
    assert result.exit_code == 0, result.output
    assert (repo / CHECKPOINT).read_bytes() == DATA
    assert "restored from commit" in result.stdout and "SHA-256 checked" in result.stdout
    assert sorted(p.name for p in (repo / RUN).iterdir()) == ["checkpoint.h5", "config.json"]  # no temp file left
    again = restore(repo / RUN, "checkpoint.h5", monkeypatch=monkeypatch)  # a path relative to where it runs
    assert again.exit_code == 0 and "already in place" in again.stdout


def test_a_shallow_clone_fetches_the_commit_it_lacks(repo, tmp_path, monkeypatch):
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    [entry] = read_manifest(shallow)
    assert subprocess.run(["git", "cat-file", "-e", f"{entry.commit}^{{commit}}"], cwd=shallow).returncode != 0
    result = restore(shallow, "--all", monkeypatch=monkeypatch)
    assert result.exit_code == 0, result.output
    assert "fetching commit" in result.stderr
    assert (shallow / CHECKPOINT).read_bytes() == DATA


def test_a_sha256_mismatch_refuses_and_writes_nothing(repo, monkeypatch):
    manifest = json.loads((repo / MANIFEST).read_text())
    manifest["checkpoints"][0]["sha256"] = "0" * 64
    (repo / MANIFEST).write_text(json.dumps(manifest))
    result = restore(repo, CHECKPOINT, monkeypatch=monkeypatch)
    assert_one_line_error(result, CHECKPOINT, "SHA-256", "nothing written", status=2)
    assert sorted(p.name for p in (repo / RUN).iterdir()) == ["config.json"]


def test_a_different_file_in_place_is_not_overwritten(repo, monkeypatch):
    (repo / CHECKPOINT).write_bytes(b"trained on since")
    result = restore(repo, CHECKPOINT, monkeypatch=monkeypatch)
    assert_one_line_error(result, CHECKPOINT, "differs", "move it away", status=2)
    assert (repo / CHECKPOINT).read_bytes() == b"trained on since"


@pytest.mark.parametrize("args,fragments", [
    ([], ["PATH", "--all"]),
    (["--all", RUN], ["not both"]),
    (["results/runs"], ["results/runs", "not a checkpoint the manifest lists"]),
])
def test_bad_requests_are_one_line(repo, monkeypatch, args, fragments):
    assert_one_line_error(restore(repo, *args, monkeypatch=monkeypatch), *fragments, status=2)


def test_outside_a_git_checkout_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "loose").mkdir()
    result = restore(tmp_path / "loose", "--all", monkeypatch=monkeypatch)
    assert_one_line_error(result, "not inside a git checkout", status=2)


def test_a_run_folder_whose_checkpoint_is_kept_reads_as_resumable(repo):
    (repo / RUN / "metrics.jsonl").write_text(json.dumps({"epoch": 4, "seconds": 1.0}) + "\n")
    state = run_state(repo / RUN)
    assert not state.has_checkpoint and state.checkpoint_kept and state.resumable
    assert state.describe() == "stopped at epoch 4 of 10"
    (repo / MANIFEST).unlink()  # without the manifest: nothing to resume from
    assert not run_state(repo / RUN).resumable


def test_a_gzipped_metrics_log_reads_as_the_plain_one(tmp_path):
    lines = "".join(json.dumps({"epoch": e, "seconds": 0.5}) + "\n" for e in (1, 2, 3))
    (tmp_path / "metrics.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert [r["epoch"] for r in RunFolder(tmp_path).read_metrics()] == [1, 2, 3]
    (tmp_path / "metrics.jsonl").write_text(lines[: lines.index("\n") + 1])  # a plain log there wins: it is live
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1]


def test_a_run_whose_checkpoint_is_kept_is_not_cleared_as_unstarted(repo):
    (repo / RUN / "metrics.jsonl").write_text(json.dumps({"epoch": 4, "seconds": 1.0}) + "\n")
    with pytest.raises(KsaeError, match="kept in git history.*restore-checkpoint"):
        clear_unstarted(repo / RUN)
    assert sorted(p.name for p in (repo / RUN).iterdir()) == ["config.json", "metrics.jsonl"]


def test_the_tables_restore_a_kept_checkpoint_before_resuming(repo):
    state = run_state(repo / RUN)
    assert paper_tables._restore(state) == [("ksae-data", ["restore-checkpoint", repo / RUN])]
    (repo / MANIFEST).unlink()
    assert paper_tables._restore(run_state(repo / RUN)) == []


def test_keep_takes_a_committed_checkpoint_out_of_the_tree_into_the_manifest(repo, monkeypatch):
    second = "results/runs/b/checkpoint.h5"
    (repo / second).parent.mkdir(parents=True)
    (repo / second).write_bytes(b"paused run")
    git(repo, "add", second)
    git(repo, "commit", "-qm", "a paused run's checkpoint")
    entry = keep(repo, second)
    git(repo, "commit", "-qm", "out of the tree")
    assert git(repo, "ls-files", second) == "" and (repo / second).read_bytes() == b"paused run"
    assert [e.path for e in read_manifest(repo)] == [CHECKPOINT, second]
    assert entry.commit == git(repo, "rev-parse", "HEAD~1").strip()
    (repo / second).unlink()
    assert restore(repo, "--all", monkeypatch=monkeypatch).exit_code == 0
    assert (repo / second).read_bytes() == b"paused run" and (repo / CHECKPOINT).read_bytes() == DATA


def test_keep_refuses_a_checkpoint_no_commit_holds_as_it_is(repo):
    second = "results/runs/b/checkpoint.h5"
    (repo / second).parent.mkdir(parents=True)
    (repo / second).write_bytes(b"never committed")
    with pytest.raises(KsaeError, match="not committed as it is"):
        keep(repo, second)
    assert [e.path for e in read_manifest(repo)] == [CHECKPOINT]
