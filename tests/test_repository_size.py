"""No file over 1 MB in the repository's tree, so that a clone stays small (issue 53: it was 188 MB, 153 MB of
them checkpoints). A checkpoint a later run continues from is kept in git history instead, listed in
results/checkpoints.json (``ksae-data restore-checkpoint``); a finished run's metrics or log over 500 KB is gzipped
(metrics.jsonl.gz, read alike; train.log.gz)."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 1_000_000  # bytes
# Files allowed over the limit, each with why. Keep it short: a new entry needs a reason a reader accepts.
ALLOWED: dict[str, str] = {}
# What a walk of a copy that is no git checkout leaves out: the tools' folders anywhere, and the folders
# .gitignore keeps out at the top (downloaded data, the quick start's runs, the built site).
NEVER_TRACKED = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis"}
IGNORED_AT_TOP = {"data", "runs", "site", "campaign-out"}


def tree_files(root: Path) -> list[Path]:
    """The files git tracks under ``root`` (that are there); in a copy that is no git checkout, every file under
    it but those of the folders above."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True)
    if listed.returncode == 0 and (root / ".git").exists():
        return [root / name for name in listed.stdout.decode().split("\0") if name and (root / name).is_file()]
    return [path for path in root.rglob("*") if path.is_file() and not _ignored(path.relative_to(root).parts)]


def _ignored(parts: tuple[str, ...]) -> bool:
    return (parts[0] in IGNORED_AT_TOP or bool(NEVER_TRACKED & set(parts))
            or any(part.endswith(".egg-info") for part in parts))


def too_large(root: Path, files: list[Path], allowed=ALLOWED) -> list[str]:
    return [f"{path.relative_to(root)} ({path.stat().st_size:,} bytes)" for path in files
            if path.stat().st_size > LIMIT and path.relative_to(root).as_posix() not in allowed]


def test_no_tracked_file_is_over_1_mb():
    files = tree_files(ROOT)
    assert len(files) > 100  # the listing found the tree
    assert too_large(ROOT, files) == [], (
        f"over {LIMIT:,} bytes: keep a checkpoint in git history (results/runs/README.md), gzip a long log")


def test_the_check_sees_a_large_file_outside_the_allow_list(tmp_path):
    (tmp_path / "results").mkdir()
    for name, size in (("results/big.h5", LIMIT + 1), ("results/allowed.bin", LIMIT + 1), ("small.txt", LIMIT)):
        with open(tmp_path / name, "wb") as f:
            f.truncate(size)  # sparse: no megabyte written
    for name in ("data/mnist.gz", "runs/quick/checkpoint.h5", ".venv/lib/x.so", "ksae_cupy.egg-info/x"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        with open(tmp_path / name, "wb") as f:
            f.truncate(LIMIT + 1)
    files = tree_files(tmp_path)  # no git checkout: the walk
    assert sorted(p.relative_to(tmp_path).as_posix() for p in files) == [
        "results/allowed.bin", "results/big.h5", "small.txt"]
    assert too_large(tmp_path, files, allowed={"results/allowed.bin": "why"}) == [
        f"results/big.h5 ({LIMIT + 1:,} bytes)"]
