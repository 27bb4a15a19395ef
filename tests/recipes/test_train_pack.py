"""bin/train-pack (ksae_cupy/recipes/train_pack.py): several ksae-train runs in one launch, each the run
``ksae-train DATASET --k K --seed S --epochs E --run-dir DIR`` makes, bit for bit on the CPU."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.cli.train import train_command
from ksae_cupy.recipes.train_pack import main
from ksae_cupy.training.checkpoint import load_checkpoint

COMMON = ["synthetic", "--hidden", "24", "--threads", "1", "--device", "cpu"]


def metrics(run_dir) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in ("seconds", "samples_per_s", "parts", "time")}
            for line in lines]


def test_each_run_is_the_run_ksae_train_makes_and_resumes_as_asked(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*COMMON, "--run", f"dir={a},k=3,seed=1,epochs=1", "--run", f"dir={b},k=5,epochs=2"]) == 0
    assert "pack of 2 run(s), one after another" in capsys.readouterr().out
    result = CliRunner().invoke(train_command, ["synthetic", "--hidden", "24", "--k", "3", "--seed", "1", "--epochs",
                                                "1", "--threads", "1", "--device", "cpu", "--quiet", "--run-dir",
                                                str(tmp_path / "alone")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    packed, alone = load_checkpoint(a / "checkpoint.h5"), load_checkpoint(tmp_path / "alone" / "checkpoint.h5")
    for name, value in alone.params.items():
        np.testing.assert_array_equal(packed.params[name], value)
    assert packed.config == alone.config and metrics(a) == metrics(tmp_path / "alone")
    # dir alone: the run as it was asked, its epochs raised; the other run is finished and trains nothing.
    assert main([*COMMON, "--run", f"dir={a},epochs=2", "--run", f"dir={b}"]) == 0
    assert [line["epoch"] for line in metrics(a)] == [1, 2] and [line["epoch"] for line in metrics(b)] == [1, 2]
    assert load_checkpoint(b / "checkpoint.h5").config["k"] == 5


@pytest.mark.parametrize("run, fragment", [("dir=x,k=three", "k 'three' is not allowed; use a whole number"),
                                           ("k=3,epochs=1", "names no folder; add dir=FOLDER"),
                                           ("dir=x,alpha=2", "'alpha=2' is not allowed"),
                                           ("dir=x,k=3", "a new run needs epochs")])
def test_a_bad_run_is_one_error_line_with_status_2(run, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*COMMON, "--run", run]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and fragment in err[0]
    assert not (tmp_path / "x").exists()
