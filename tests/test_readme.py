"""The README's commands run as written: every code block marked ``<!-- readme-test ... -->`` is run
here, shortened only where its mark says (``A => B`` lines: each A must be in the block, and is
replaced by B), so a command the README prints cannot drift from what the tools accept."""
from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ksae_cupy.datasets.synthetic import make_sparse_signals

ROOT = Path(__file__).resolve().parents[1]
MARKED = re.compile(r"<!-- readme-test[^\n]*\n(?P<subs>.*?)-->\n```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)


def marked_blocks() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """``(language, code, [(A, B), ...])`` of every marked block, in README order."""
    blocks = []
    for match in MARKED.finditer((ROOT / "README.md").read_text()):
        subs = [tuple(part.strip() for part in line.split("=>", 1)) for line in match["subs"].splitlines()
                if "=>" in line]
        blocks.append((match["lang"], match["code"], subs))
    return blocks


def shortened(code: str, subs) -> str:
    for old, new in subs:
        assert old in code, f"the README's mark names {old!r}, which its block no longer holds:\n{code}"
        code = code.replace(old, new)
    return code


def block_with(text: str, lang: str):
    found = [(code, subs) for block_lang, code, subs in marked_blocks() if block_lang == lang and text in code]
    assert len(found) == 1, f"one marked {lang} block holding {text!r} expected, found {len(found)}"
    return found[0]


def environment() -> dict:
    """This interpreter's scripts (ksae-train, ...) first on PATH: the environment the install made."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("KSAE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_bash(code: str, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=cwd, env=environment(),
                            capture_output=True, text=True, timeout=900)  # a hang guard only
    assert result.returncode == 0, f"{code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    return result


def write_mydata(folder: Path) -> None:
    """A small labelled ``mydata.npz`` as the README describes: X, y, X_test, y_test."""
    X, y, _ = make_sparse_signals(1500, n_classes=4, seed=3)
    np.savez(folder / "mydata.npz", X=X[:1200], y=y[:1200], X_test=X[1200:], y_test=y[1200:])


def test_the_quick_start_installs_the_common_path_in_one_extra():
    code, subs = block_with("ksae-train mnist --epochs 10", "bash")
    assert ". .venv/bin/activate" in code  # the commands after it run as written
    extra = re.search(r"pip install '\.\[(\w+)\]'", code)[1]
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    packages = config["options.extras_require"][extra]
    for needed in ("scikit-learn", "matplotlib", "numba"):  # the README's snippet, ksae-plot, the CPU kernels
        assert needed in packages, (extra, packages)
    # Only the install lines are left to the test's own environment.
    assert {old for old, new in subs if new == "true"} == {
        "python3 -m venv .venv && . .venv/bin/activate", "pip install '.[full]'"}


def test_quick_start_runs_as_written_and_ends_in_a_test_error(tmp_path):
    code, subs = block_with("ksae-train mnist --epochs 10", "bash")
    result = run_bash(shortened(code, subs), tmp_path)
    evaluation = json.loads((tmp_path / "runs" / "quick" / "eval.json").read_text())
    assert 0 <= evaluation["features"]["test_error"] < 0.75  # 4 classes: chance is 0.75
    assert "| supp_(alpha k)(W^T x + b) |" in result.stdout


def test_your_own_data_commands_run_as_written(tmp_path):
    write_mydata(tmp_path)
    code, subs = block_with("ksae-train mydata.npz", "bash")
    run_bash(shortened(code, subs), tmp_path)
    evaluation = json.loads((tmp_path / "runs" / "mydata" / "eval.json").read_text())
    assert 0 <= evaluation["features"]["test_error"] < 0.75


def test_your_own_data_in_python_runs_as_written(tmp_path):
    write_mydata(tmp_path)
    code, subs = block_with("ksae_cupy.load_dataset(\"mydata.npz\"", "python")
    result = subprocess.run([sys.executable, "-c", shortened(code, subs)], cwd=tmp_path, env=environment(),
                            capture_output=True, text=True, timeout=900)  # a hang guard only
    assert result.returncode == 0, result.stderr
    assert re.search(r"^test error 0\.\d+", result.stdout, re.M), result.stdout
    assert [line.split()[1] for line in result.stdout.splitlines() if line.startswith("epoch ")] == ["1/2", "2/2"]
    assert (tmp_path / "mydata-k25.h5").is_file()


def test_every_marked_block_is_run_here():
    # A new mark in the README needs a test above; this keeps the two in step.
    assert [(lang, code.split("\n", 1)[0]) for lang, code, _ in marked_blocks()] == [
        ("bash", "python3 -m venv .venv && . .venv/bin/activate      # every command below runs in this environment"),
        ("bash", "ksae-train mydata.npz --k 25 --epochs 20 --run-dir runs/mydata   # --lr auto is the default for your files"),
        ("python", "import ksae_cupy"),
    ]


@pytest.mark.parametrize("mark", ["<!-- readme-test\nA => B\n-->\n```bash\nC\n```"])
def test_a_mark_that_names_text_missing_from_its_block_fails(mark):
    match = MARKED.search(mark)
    with pytest.raises(AssertionError, match="no longer holds"):
        shortened(match["code"], [("A", "B")])


def test_the_readme_is_a_front_page():
    # Issue 36: the README is the front page (<= 250 lines); the rest lives in the handbook under docs/.
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/ (mkdocs.yml's nav)"


def test_the_readme_defaults_table_is_the_declared_defaults():
    """The README's "Defaults and where they come from" table says what `ksae-train` takes when an
    option is not given: each figure equals the declaration the command is built from."""
    from ksae_cupy.training.fields import TRAIN

    declared = {option.spelled: option.default for option in TRAIN}
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Defaults and where they come from"):]
    rows = dict(re.findall(r"^\| `(--[a-z-]+)` \| ([^|]+?) \|", table, flags=re.M))
    assert {"--hidden", "--k", "--epochs", "--momentum", "--sigma", "--batch-size", "--topk"} <= set(rows)
    for flag, shown in rows.items():
        if flag in ("--k-start", "--lr"):  # a rule, not one number: their own tests hold them
            continue
        first = shown.split(";")[0].split(" (")[0].strip().strip("`")
        assert first == str(declared[flag]), f"README says {flag} {shown!r}; ksae-train's default is {declared[flag]!r}"
