"""bin/gpu-campaign's dry run: every stage's plumbing on the CPU, so a GPU session's first call works."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from clicheck import assert_one_line_error

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bin" / "gpu-campaign"
STAGES = ("env", "tests", "step", "epoch", "packed", "grid", "mnist", "finetune", "collect")
# The campaign's own clock (9 minutes by default: stages past it are cut short or not started) set
# beyond campaign()'s hang guard, so that only a real hang ends a run early, however loaded the machine.
BUDGET = ("--budget-minutes", "60")


def campaign(cwd: Path, *args: str, timeout: float = 900):
    # The time-out only guards against a hang: the dry run takes ~40 s here, and went past 240 s
    # on this 2-core machine at load average 10.
    # The repository, after what the test put first (the CuPy stand-in's folder for --device gpu).
    pythonpath = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return SimpleNamespace(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr,
                           output=proc.stdout + proc.stderr)


def statuses(out: Path) -> dict:
    return {name: entry["status"] for name, entry in json.loads((out / "campaign.json").read_text())["stages"].items()}


def epochs_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_dry_run_runs_every_stage_and_records_where_it_ran(tmp_path):
    result = campaign(tmp_path, "out", "--dry-run", *BUDGET)
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing beside OUT_DIR
    assert statuses(out) == {"env": "done", "tests": "done", "step": "done", "epoch": "skipped", "packed": "done",
                             "grid": "skipped", "mnist": "done", "finetune": "done", "collect": "done"}
    for stage in STAGES:
        payload = json.loads((out / f"{stage}.json").read_text())
        assert payload["meta"]["device"] == "cpu"
        assert payload["meta"]["commit"] and payload["meta"]["date"]
        assert (out / f"{stage}.md").read_text().startswith(f"# gpu-campaign: {stage}")
        assert f"{stage}: start" in result.stdout  # one progress line per stage
    # Each stage really ran its command: the kernel grid refused the CPU, the others produced results.
    assert "use --device gpu" in (out / "logs" / "grid.log").read_text()
    step = json.loads((out / json.loads((out / "step.json").read_text())["result_file"]).read_text())
    assert "seconds_per_epoch" in step["results"]["ours_trainer"]  # validated, then timed
    packed = json.loads((out / json.loads((out / "packed.json").read_text())["result_file"]).read_text())
    assert [row["runs"] for row in packed["packs"]] == [1, 4] and "| 4 |" in (out / "packed.md").read_text()
    rows = json.loads((out / "mnist.json").read_text())["rows"]
    assert [r["k"] for r in rows] == [4, 2]

    # A second call runs again only the checks of the code done at another commit (here: tests).
    state = json.loads((out / "campaign.json").read_text())
    state["stages"]["tests"]["commit"] = "0" * 40
    (out / "campaign.json").write_text(json.dumps(state))
    again = campaign(tmp_path, "out", "--dry-run", *BUDGET)
    assert again.exit_code == 0, again.output
    assert "tests: start" in again.stdout
    for stage in ("env", "step", "epoch", "packed", "grid", "mnist", "finetune"):
        assert f"{stage}: {statuses(out)[stage]} in an earlier call" in again.stdout
    for r in rows:
        assert r["epochs"] == r["target"] == 3
        assert 0.0 <= r["test_error"] < 1.0
        assert epochs_logged(out / r["run_dir"]) == [1, 2, 3]
    assert "k-Sparse AE + F.T." in (out / "finetune.md").read_text()
    # layer 1 of the fine-tuning rows is the mnist stage's finished k = 4 run, not trained again
    command = json.loads((out / "finetune.json").read_text())["command"]
    assert command[command.index("--ksparse1") + 1] == str(out / "mnist" / "k4")
    assert not (out / "finetune" / "pretrain" / "ksparse1").exists()
    assert epochs_logged(out / "finetune" / "pretrain" / "ksparse2") == [1, 2, 3]
    summary = (out / "summary.md").read_text()
    for stage in STAGES[:-1]:
        assert f"| {stage} |" in summary


@pytest.mark.gpu
def test_tiny_gpu_run_takes_the_gpu_branches(tmp_path, gpu_cupy):
    """--tiny --device gpu: NVRTC compiles every kernel and three GPU tests run (not skip), on a GPU or
    the CuPy stand-in without one."""
    result = campaign(tmp_path, "out", "--tiny", "--device", "gpu", "--stage", "env", "--stage", "tests", *BUDGET)
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    assert statuses(out) == {"env": "done", "tests": "done"}
    env = json.loads((out / "env.json").read_text())
    assert env["meta"]["device"] != "cpu" and env["meta"]["mode"] == "tiny (gpu)"
    assert env["nvrtc_compiled"] == env["kernels"] and env["nvrtc_failed"] == {}
    assert json.loads((out / "tests.json").read_text())["counts"]["passed"] == 3


@pytest.mark.gpu
def test_benchmarks_in_one_call_down_the_gpu_branches(tmp_path, gpu_cupy):
    """--benchmarks --tiny --device gpu: env, step, epoch, packed, grid and collect in one call, each figure with
    its device, versions, commit and date; the step's variants validated before they are timed; ksae-bench
    train's epochs timed on a fresh and on a trained model; every stage run again by a second call (figures
    are of the commit and the device)."""
    result = campaign(tmp_path, "out", "--benchmarks", "--tiny", "--device", "gpu", *BUDGET)
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    assert statuses(out) == {"env": "done", "step": "done", "epoch": "done", "packed": "done", "grid": "done",
                             "collect": "done"}
    for stage in ("step", "epoch", "grid"):
        figures = json.loads((out / json.loads((out / f"{stage}.json").read_text())["result_file"]).read_text())
        for key in ("device", "cupy", "cuda_runtime", "cuda_driver", "numpy", "commit", "date"):
            assert figures["meta"][key], (stage, key)
        assert "torch" in figures["meta"]
    step = json.loads((out / json.loads((out / "step.json").read_text())["result_file"]).read_text())
    for name in ("ours_step_graphs_sort", "ours_step_graphs_threshold", "ours_trainer"):
        assert step["results"][name]["timed_epochs"] == 5, name
    grid = json.loads((out / json.loads((out / "grid.json").read_text())["result_file"]).read_text())
    ours = [r for r in grid["results"] if r["candidate"].startswith("ksae")]
    assert len(ours) == 4 and all(r["valid"] for r in ours)  # block and radix, sort and threshold
    packed = json.loads((out / json.loads((out / "packed.json").read_text())["result_file"]).read_text())
    assert [(row["runs"], row["stacked"]) for row in packed["packs"]] == [(1, True), (4, True)]  # validated, timed
    epoch = json.loads((out / json.loads((out / "epoch.json").read_text())["result_file"]).read_text())
    assert json.loads((out / "epoch.json").read_text())["command"][:4] == ["ksae-bench", "train", "--device", "gpu"]
    assert (epoch["starts"]["fresh"]["epoch"], epoch["starts"]["trained"]["epoch"]) == (0, 2)  # a trained model
    for which, records in epoch["results"].items():  # ksae-train's GPU path, from each start, checked then timed
        assert records["trainer_epoch_graph_sort"]["from_epoch"] == epoch["starts"][which]["epoch"]
        assert "seconds_per_epoch" in records["trainer_epoch_graph_sort"], (which, records)
    assert "| trainer_epoch_graph_sort |" in (out / "epoch.md").read_text()
    assert "| step | done |" in (out / "summary.md").read_text()
    again = campaign(tmp_path, "out", "--benchmarks", "--tiny", "--device", "gpu", *BUDGET)
    assert again.exit_code == 0 and all(f"{stage}: start" in again.stdout for stage in ("env", "step", "epoch", "grid"))


def test_second_call_resumes_the_interrupted_training(tmp_path):
    args = ["out", "--dry-run", "--stage", "mnist", "--ks", "3", "--epochs", "20", *BUDGET]
    out = tmp_path / "out"
    run_dir = out / "mnist" / "k3"
    # Stopped on an event (2 epochs logged), not a clock: the same on a quiet or a loaded machine.
    first = campaign(tmp_path, *args, "--stop-after-epochs", "2")
    assert first.exit_code == 0, first.output
    assert statuses(out)["mnist"] == "partial"
    stopped_at = epochs_logged(run_dir)
    assert 2 <= len(stopped_at) < 20 and (run_dir / "checkpoint.h5").exists()

    second = campaign(tmp_path, *args)
    assert second.exit_code == 0, second.output
    assert statuses(out)["mnist"] == "done"
    assert f"training from epoch {len(stopped_at)} to 20" in second.stdout
    assert epochs_logged(run_dir) == list(range(1, 21))  # continued, not restarted
    assert json.loads((out / "mnist.json").read_text())["rows"][0]["test_error"] is not None


@pytest.mark.parametrize("args, fragments", [
    (["--budget-minutes", "0"], ["--budget-minutes 0", "positive"]),
    (["--stage", "bench"], ["--stage 'bench'", "env, tests, step"]),
    (["--benchmarks", "--stage", "env"], ["--benchmarks and --stage are not allowed together"]),
    (["--device", "tpu"], ["--device 'tpu'", "gpu, gpu:N or cpu"]),
    (["--device", "cpu"], ["--device cpu needs --tiny"]),
    (["--ks", "25,x"], ["--ks 'x'", "positive integers"]),
    (["--ks", "25+dropout"], ["--ks '25+dropout'", "K[+auxkA][+center][+seedS]"]),
    (["--stop-after-epochs", "0"], ["--stop-after-epochs 0", "positive"]),
    (["--side-by-side", "0"], ["--side-by-side 0", "positive number of runs"]),
])
def test_bad_options_are_one_line_errors_and_write_nothing(tmp_path, args, fragments):
    result = campaign(tmp_path, "out", *args, timeout=60)  # refused before any work: ~0.3 s under two busy loops
    assert_one_line_error(result, *fragments, status=2)
    assert not (tmp_path / "out").exists()


def test_a_run_spec_trains_with_its_options(tmp_path):
    result = campaign(tmp_path, "out", "--dry-run", "--stage", "mnist", "--ks", "3+auxk4+center+seed1", "--epochs", "2",
                      *BUDGET)
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "out" / "mnist" / "k3-auxk4-center-seed1"
    train = json.loads((run_dir / "config.json").read_text())["train"]
    assert (train["k"], train["aux_k"], train["center_input"], train["seed"]) == (3, 4, True, 1)
    row = json.loads((tmp_path / "out" / "mnist.json").read_text())["rows"][0]
    assert (row["name"], row["k"], row["epochs"]) == ("k3-auxk4-center-seed1", 3, 2)


def test_runs_side_by_side_stop_and_resume_each_in_the_order_given(tmp_path):
    """Three runs, two at once: each is stopped (checkpoint saved) and each continues on the next call;
    the table keeps the order of --ks whichever run ends first."""
    args = ["out", "--dry-run", "--stage", "mnist", "--ks", "3,2,4", "--epochs", "20", "--side-by-side", "2", *BUDGET]
    out = tmp_path / "out"
    first = campaign(tmp_path, *args, "--stop-after-epochs", "2")
    assert first.exit_code == 0, first.output
    assert "mnist: 3 runs, 2 side by side" in first.stdout
    assert statuses(out)["mnist"] == "partial"
    stopped = {k: epochs_logged(out / "mnist" / f"k{k}") for k in (3, 2, 4)}
    # each run is stopped once 2 epochs are logged; a tiny run may end its 20 before the poll sees it
    assert all(len(epochs) >= 2 for epochs in stopped.values()), stopped
    payload = json.loads((out / "mnist.json").read_text())
    assert payload["side_by_side"] == 2 and [r["name"] for r in payload["rows"]] == ["k3", "k2", "k4"]

    second = campaign(tmp_path, *args)
    assert second.exit_code == 0, second.output
    assert statuses(out)["mnist"] == "done"
    for k, epochs in stopped.items():
        if len(epochs) < 20:
            assert f"mnist k{k}: training from epoch {len(epochs)} to 20" in second.stdout
        assert epochs_logged(out / "mnist" / f"k{k}") == list(range(1, 21))  # continued, not restarted
    rows = json.loads((out / "mnist.json").read_text())["rows"]
    assert [(r["name"], r["epochs"]) for r in rows] == [("k3", 20), ("k2", 20), ("k4", 20)]
    assert all(r["test_error"] is not None for r in rows)
