"""The packed-runs benchmark (ksae_cupy.bench.packed_runs): found by a feature check, skipped with the reason
while the API is absent, and no time for a launch whose runs' losses are not finite or grew. The API itself
is played here by a stand-in that writes each run's metrics.jsonl, so that the checks around it are tested."""
from __future__ import annotations

import json
import math

import pytest

from ksae_cupy.bench import packed_runs


def _fake_train_packed(losses_of_seed):
    """A ``train_packed`` that logs, for each config, the epochs ``losses_of_seed(seed, runs)`` gives."""
    calls = []

    def train_packed(configs, data, backend, folders):
        calls.append(len(configs))
        assert len(folders) == len(configs) and data.X_train.shape[0] == 512
        for config, folder in zip(configs, folders):
            folder.mkdir(parents=True)
            lines = [json.dumps({"epoch": e + 1, "train_loss": loss, "seconds": 0.5 * len(configs)})
                     for e, loss in enumerate(losses_of_seed(config.seed, len(configs)))]
            (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")

    return train_packed, calls


def test_absent_api_is_a_skip_with_its_reason(tmp_path):
    out = packed_runs.bench_packed("cpu", tiny=True, out_dir=tmp_path)
    if packed_runs.find_train_packed()[0] is None:
        assert out["status"] == "skipped" and "no train_packed in ksae_cupy.training.packed" in out["reason"]
        assert "launches" not in out
    else:  # merged: the tiny launches ran on the CPU, checked as below
        assert out["status"] == "done", out["reason"]
    assert json.loads(open(out["path"]).read())["meta"]["commit"]


def test_one_and_packed_runs_are_checked_then_timed(tmp_path, monkeypatch):
    fake, calls = _fake_train_packed(lambda seed, runs: [3.0 - seed * 0.01, 2.0, 1.5])
    monkeypatch.setattr(packed_runs, "find_train_packed", lambda: (fake, "tests.fake"))
    monkeypatch.setattr(packed_runs, "TINY_EPOCHS", 3)
    out = packed_runs.bench_packed("cpu", tiny=True, out_dir=tmp_path)
    assert out["status"] == "done" and calls == [1, 4]
    assert out["launches"]["1"]["seconds_per_epoch"] == 0.5 and out["launches"]["4"]["seconds_per_epoch"] == 2.0
    assert out["packed_over_alone"] == 4.0 and out["seed0_alone_vs_packed_max_rel_diff"] == 0.0


@pytest.mark.parametrize("losses, fragment", [
    (lambda seed, runs: [3.0, math.nan], "not finite"),
    (lambda seed, runs: [3.0, 2.0] if seed < 2 else [3.0, 9.0], "run 2 diverged"),
])
def test_a_launch_whose_loss_is_not_finite_or_grew_gets_no_time(tmp_path, monkeypatch, losses, fragment):
    fake, _ = _fake_train_packed(losses)
    monkeypatch.setattr(packed_runs, "find_train_packed", lambda: (fake, "tests.fake"))
    out = packed_runs.bench_packed("cpu", tiny=True, out_dir=tmp_path)
    assert out["status"] == "failed" and fragment in out["reason"] and "no time reported" in out["reason"]
    assert not any("seconds_per_epoch" in r for r in out["launches"].values() if "refused" in r)
    assert "packed_over_alone" not in out


def test_a_packed_run_that_differs_from_the_same_run_alone_fails(tmp_path, monkeypatch):
    fake, _ = _fake_train_packed(lambda seed, runs: [3.0, 2.0 + 0.1 * (runs > 1)])
    monkeypatch.setattr(packed_runs, "find_train_packed", lambda: (fake, "tests.fake"))
    out = packed_runs.bench_packed("cpu", tiny=True, out_dir=tmp_path)
    assert out["status"] == "failed" and out["reason"].startswith("seed 0 packed differs from seed 0 alone by 0.05")
