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


def write_mydata(folder: Path, test_set: bool = True) -> None:
    """A small labelled ``mydata.npz`` as the README describes: X, y and, if ``test_set``, X_test, y_test."""
    X, y, _ = make_sparse_signals(1500, n_classes=4, seed=3)
    tests = dict(X_test=X[1200:], y_test=y[1200:]) if test_set else {}
    np.savez(folder / "mydata.npz", X=X[:1200], y=y[:1200], **tests)


def shape(line: str) -> str:
    """A printed line with its figures replaced: what stays the same from run to run."""
    return re.sub(r"\d[\d,.]*", "N", line)


def printed_last() -> list[str]:
    """The lines of the README's "What the first two commands print last" block."""
    text = (ROOT / "README.md").read_text()
    return text[text.index("What the first two commands print last"):].split("```\n", 2)[1].splitlines()


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
    # What the README shows it prints last: the training's last lines as the commands word them.
    from ksae_cupy.training.wording import dead_units_note

    epoch, dead, done, gap, test_error = printed_last()
    printed = result.stdout.splitlines()
    trained = [line for line in printed if line.startswith(("epoch ", "done: "))][-2:]
    assert [shape(epoch), shape(done)] == [shape(line) for line in trained], trained
    n_dead = int(re.search(r"\(dead (\d+) of 1000, ", done)[1])  # the note and the done line tell one count
    assert dead == dead_units_note(n_dead, 1000) and f"(dead {n_dead} of 1000, {n_dead / 10:.1f}%: " in done
    assert (tmp_path / "runs" / "quick" / "filters.png").is_file()  # the quick start ends with the picture
    last = r"test error \d+\.\d\d% \(alpha=\d+, l2=[\de.+-]+, refit on train\+valid; \d+ s\)"
    assert gap == "..." and re.fullmatch(last, test_error)
    assert re.fullmatch(last, result.stderr.splitlines()[-1]), result.stderr.splitlines()[-3:]  # ksae-eval's last line


def test_your_own_data_commands_run_as_written(tmp_path):
    write_mydata(tmp_path)
    code, subs = block_with("ksae-train mydata.npz", "bash")
    run_bash(shortened(code, subs), tmp_path)
    evaluation = json.loads((tmp_path / "runs" / "mydata" / "eval.json").read_text())
    assert 0 <= evaluation["features"]["test_error"] < 0.75


def test_own_data_without_a_test_set_runs_as_written(tmp_path):
    X, y, _ = make_sparse_signals(1500, n_classes=4, seed=3)
    np.savez(tmp_path / "notest.npz", X=X[:1200], y=y[:1200])
    np.savez(tmp_path / "mytest.npz", X=X[1200:], y=y[1200:])
    code, subs = block_with("ksae-train notest.npz", "bash")
    result = run_bash(shortened(code, subs), tmp_path)
    assert result.stdout.count("note: notest.npz has no test set") == 1  # the second training, not the first
    for run in ("held-out", "no-test"):
        evaluation = json.loads((tmp_path / "runs" / run / "eval.json").read_text())
        assert 0 <= evaluation["features"]["test_error"] < 0.75


@pytest.mark.parametrize("test_set, split", [(True, "test"), (False, "valid")])
def test_your_own_data_in_python_runs_as_written(tmp_path, test_set, split):
    # Issue 55: without X_test (optional, the README says) the block failed in scikit-learn
    # ("Expected 2D array, got scalar array instead: array=nan"); it now scores the validation rows.
    write_mydata(tmp_path, test_set)
    code, subs = block_with("ksae_cupy.load_dataset(\"mydata.npz\"", "python")
    result = subprocess.run([sys.executable, "-c", shortened(code, subs)], cwd=tmp_path, env=environment(),
                            capture_output=True, text=True, timeout=900)  # a hang guard only
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(rf"{split} error 0\.\d+", lines[-1]), result.stdout
    assert lines[-2] == "fitting logistic regression on the alpha*k-sparse features"  # not silent while it fits
    assert [line.split()[1] for line in lines if line.startswith("epoch ")] == ["1/2", "2/2"]
    assert (tmp_path / "mydata-k25.h5").is_file()


def test_every_marked_block_is_run_here():
    # A new mark in the README needs a test above; this keeps the two in step.
    assert [(lang, code.split("\n", 1)[0]) for lang, code, _ in marked_blocks()] == [
        ("bash", "python3 -m venv .venv && . .venv/bin/activate      # every command below runs in this environment"),
        ("bash", "ksae-train mydata.npz --k 25 --epochs 20 --run-dir runs/mydata   # --lr auto is the default for your files"),
        ("bash", "ksae-train notest.npz --k 25 --epochs 20 --test-fraction 0.1 --run-dir runs/held-out && ksae-eval runs/held-out"),
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
    from ksae_cupy.session.fields import TRAIN

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


def console_scripts() -> dict:
    """``{script: click command}`` as setup.cfg installs them."""
    import importlib

    import click

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    scripts = {}
    for line in config["options.entry_points"]["console_scripts"].strip().splitlines():
        name, target = (part.strip() for part in line.split("="))
        module, attribute = importlib.import_module(target.split(":")[0]), target.split(":")[1]
        command = getattr(module, attribute)
        if not isinstance(command, click.Command):  # a main() that calls the module's click command
            command = next(value for value in vars(module).values()
                           if isinstance(value, click.Command) and value.callback.__module__ == module.__name__)
        scripts[name] = command
    return scripts


def test_the_command_table_names_what_each_command_takes():
    """Issue 55: the table's `ksae-analyze theorem RUN_DIR` failed (it wanted --dictionary). Every
    `ksae-...` cell of the README's command table is checked against the command's own usage: its
    subcommands exist, each takes the RUN_DIR / DATASET the cell shows, and each option is one it has."""
    import click
    from click.testing import CliRunner

    scripts = console_scripts()
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Commands"):text.index("## Defaults and where they come from")]
    cells = re.findall(r"^\| `(ksae-[^`]+)` \|", table, flags=re.M)
    assert len(cells) == 9, cells  # every console script has its row
    for cell in cells:
        words = cell.replace("\\|", "|").split()
        command = scripts[words[0]]
        subcommands = [None]
        if isinstance(command, click.Group):
            subcommands = words[1].split("|")
            words = words[2:]
        else:
            words = words[1:]
        for sub in subcommands:
            args = [sub, "--help"] if sub else ["--help"]
            shown = CliRunner().invoke(command, args)
            assert shown.exit_code == 0, (cell, sub, shown.output)
            usage, after_value = shown.output.split("\n\n", 1)[0], False
            for word in words:
                word = word.strip("[]")
                if word.startswith("--"):
                    assert re.search(rf"^\s+(-\w, )?{re.escape(word)}\b", shown.output, re.M), (cell, sub, word)
                    after_value = True
                elif re.fullmatch(r"[A-Z_0-9]+", word) and not after_value:
                    assert re.sub(r"_\d+$", "", word) in usage, (cell, sub, word, usage)


def test_the_training_pages_sample_config_has_the_keys_a_run_writes(tmp_path):
    """docs/guide/training.md's sample output prints the run's config as ksae-train does: the same
    keys as the config.json (``train``) and the `config:` line of a run made here."""
    result = run_bash("ksae-train synthetic --hidden 16 --k 2 --epochs 1 --device cpu --threads 1 --run-dir run",
                      tmp_path)
    written = set(json.loads((tmp_path / "run" / "config.json").read_text())["train"])
    printed = [set(json.loads(line[len("config: "):])) for line in result.stdout.splitlines()
               if line.startswith("config: ")]
    assert printed == [written]
    page = (ROOT / "docs" / "guide" / "training.md").read_text()
    samples = [set(json.loads(line[len("config: "):])) for line in page.splitlines() if line.startswith("config: ")]
    assert len(samples) == 2
    for sample in samples:
        assert sample == written, f"missing {written - sample}, extra {sample - written}"


def test_the_testing_page_quotes_no_test_count():
    # A count of tests is stale after the next test added (the page said 1074); it names the command.
    page = (ROOT / "docs" / "guide" / "testing.md").read_text()
    assert not re.search(r"\d[\d,]* (passed|tests)\b", page), re.search(r".{40}\d[\d,]* (passed|tests)\b.{20}", page)
    assert "pytest --collect-only -q" in page


def test_the_guides_python_block_is_the_readmes():
    # docs/guide/your-data.md repeats the README's block: one text, so a fix reaches both.
    block = re.compile(r"```python\nimport ksae_cupy\n.*?```", re.S)
    guide = (ROOT / "docs" / "guide" / "your-data.md").read_text()
    assert block.search(guide)[0] == block.search((ROOT / "README.md").read_text())[0]


# -- every measured figure of the README names its committed file, which is read here and checked by value ----

QUICK_START_RECORD = re.compile(r"`(results/quickstart/[\w.-]+\.json)`")


def quick_start_record() -> tuple[str, dict]:
    """The record the README's quick start names (what the two commands printed, on which machine) and its text."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start"):text.index("## Install")]
    name = QUICK_START_RECORD.search(section)[1]
    return section, json.loads((ROOT / name).read_text())


def test_the_quick_starts_printed_lines_are_those_of_its_recorded_run():
    _, record = quick_start_record()
    train, evaluate = record["commands"]
    assert [c["argv"][0] for c in record["commands"]] == ["ksae-train", "ksae-eval"]
    assert train["exit_status"] == evaluate["exit_status"] == 0
    said = train["stdout_tail"] + train["stderr_tail"] + evaluate["stdout_tail"] + evaluate["stderr_tail"]
    shown = [line for line in printed_last() if line != "..."]
    assert len(shown) == 4 and all(line in said for line in shown), [line for line in shown if line not in said]
    assert shown[-1] == evaluate["stderr_tail"][-1]  # ksae-eval's last line: its test error


def test_the_quick_starts_timings_and_error_are_its_recorded_runs():
    section, record = quick_start_record()
    train, evaluate = record["commands"]
    timings = re.search(r"training took (\d+) s and the evaluation (\d+) s", section)
    assert timings and [int(t) for t in timings.groups()] == [round(train["wall_seconds"]),
                                                              round(evaluate["wall_seconds"])]
    error = re.search(r"test error (\d+\.\d\d)%", evaluate["stderr_tail"][-1])[1]
    assert f"Expect about {error}%" in section
    for figure in (record["machine"]["cpu"], f"{record['machine']['cores']} cores", record["date"][:10]):
        assert figure in section, figure


def test_the_shallow_clones_size_is_the_recorded_one():
    _, record = quick_start_record()
    size = record["shallow_clone"]["du_sh"].removesuffix("M")
    for page in ("README.md", "docs/guide/data.md"):
        assert re.search(rf"{size} MB on disk by `du -sh`", (ROOT / page).read_text()), page


def test_the_paper_length_k25_figures_are_their_run_folders():
    import gzip

    text = (ROOT / "README.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("On one CPU core:"))
    cpu = json.loads((ROOT / "results/runs/mnist-k25-5000/eval.json").read_text())
    gpu = json.loads((ROOT / "results/runs/mnist-k25-5000-gpu/eval.json").read_text())
    assert f"`ksae-eval`: {100 * cpu['features']['test_error']:.2f}% test error" in line
    assert f"`results/runs/mnist-k25-5000-gpu`): {100 * gpu['features']['test_error']:.2f}%" in line
    with gzip.open(ROOT / "results/runs/mnist-k25-5000/train.log.gz", "rt") as log:
        done = next(l for l in log if l.startswith("done: "))
    seconds = float(re.search(r"in ([\d.]+) s", done)[1])
    assert f"5000 epochs in {seconds:,.0f} s" in line


def readme_table_figures() -> list[tuple[str, str]]:
    """``(row, figure)`` of every percentage in the "ours" column of the README's two paper tables."""
    text = (ROOT / "README.md").read_text()
    figures = []
    for heading in ("| Table err_mnist", "| Table fn_mnist"):
        block = text[text.index(heading):].split("\n\n", 1)[0]
        for line in block.splitlines()[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            figures += [(cells[0], figure) for figure in re.findall(r"\d+\.\d\d% ± \d\.\d\d|\d+\.\d\d%", cells[2])]
    return figures


def test_every_figure_of_the_readmes_tables_is_a_test_figure_of_the_generated_tables():
    generated = (ROOT / "results" / "paper-tables.md").read_text()
    ours = {[c.strip() for c in line.strip("|").split("|")][2] for line in generated.splitlines()
            if line.startswith("| ") and line.count("|") == 10}
    figures = readme_table_figures()
    assert len(figures) >= 15
    assert [(row, figure) for row, figure in figures if figure not in ours] == []
