"""Every row of results/paper-tables.md runs again from a clone: the folders its command reads are in the
repository and hold what the command needs (after ksae-data restore-checkpoint --all)."""
import json
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TABLES = REPO / "results" / "paper-tables.md"


def kept_checkpoints() -> set[str]:
    manifest = json.loads((REPO / "results" / "checkpoints.json").read_text())
    return {entry["path"] for entry in manifest["checkpoints"]}


def row_commands(markdown: str) -> list[tuple[str, list[str]]]:
    """``(row label, argv)`` of every command in the Command cell of every table line."""
    commands = []
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 9 or cells[0] in ("Row", "---") or set(cells[0]) <= {"-"}:
            continue
        for text in cells[7].split("`")[1::2]:
            commands.append((cells[0], shlex.split(text)))
    return commands


def inputs_of(argv: list[str]) -> list[str]:
    """The run folders whose checkpoints the command reads: ksae-eval's run, ksae-finetune's positional runs."""
    if argv[0] == "ksae-eval":
        return argv[1:2]
    if argv[0] == "ksae-finetune":
        return [a for a in _positional(argv[1:])]
    return []


def _positional(args: list[str]) -> list[str]:
    flags_without_value = {"--no-pretraining"}
    folders, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("--"):
            skip = arg not in flags_without_value and "=" not in arg
        else:
            folders.append(arg)
    return folders


def problems(markdown: str, repo: Path, kept: set[str]) -> list[str]:
    found = []
    for label, argv in row_commands(markdown):
        for folder in inputs_of(argv):
            path = (repo / folder).resolve()
            if not path.is_relative_to(repo.resolve()):
                found.append(f"{label}: {argv[0]} reads {folder}, outside the repository")
            elif not (path / "config.json").is_file():
                found.append(f"{label}: {argv[0]} reads {folder}, which is no run folder in the repository")
            elif not (path / "checkpoint.h5").is_file() and f"{folder}/checkpoint.h5" not in kept:
                found.append(f"{label}: {argv[0]} reads {folder}, whose checkpoint is neither in the tree nor in "
                             f"results/checkpoints.json")
        if "--run-dir" in argv:
            run_dir = argv[argv.index("--run-dir") + 1]
            if not (repo / run_dir / "config.json").is_file():
                found.append(f"{label}: its --run-dir {run_dir} is no run folder in the repository")
    return found


def test_every_row_of_the_committed_tables_runs_again_from_a_clone():
    markdown = TABLES.read_text()
    assert len(row_commands(markdown)) >= 30  # both tables were read
    assert problems(markdown, REPO, kept_checkpoints()) == []


@pytest.mark.parametrize("command, expected", [
    ("ksae-finetune /root/runs/mnist-k25-500 --epochs 200 --seed 0 --run-dir results/runs/fn-ksparse-500-200",
     "outside the repository"),
    ("ksae-eval results/runs/mnist-k25-500-paper", "neither in the tree nor in results/checkpoints.json"),
    ("ksae-eval results/runs/no-such-run --l2-extend 0", "no run folder in the repository"),
])
def test_a_row_whose_inputs_are_gone_is_found(command, expected):
    row = f"| k = 25 | 1.35% | 1.66% | 1.66% | +0.31 | 200 | 0 | `{command}` | x |"
    found = problems(row, REPO, kept_checkpoints())
    assert len(found) == 1 and expected in found[0], found


def test_a_restorable_row_is_not_flagged():
    row = "| k = 25 | 1.35% | 1.82% | 1.82% | +0.47 | 5000 | 0 | `ksae-eval results/runs/mnist-k25-5000 --l2-extend 0` | x |"
    assert problems(row, REPO, kept_checkpoints()) == []
