"""Many runs in one launch on the GPU (ksae_cupy/training/packed.py): the runs of a pack stepped as one
stacked model, on a GPU with CuPy and elsewhere against the strict CuPy stand-in (tests/cupy_standin).
Each packed GPU run equals its CPU run alone within float32 rounding (same data order, initial weights,
kept units), and its run folder is an ordinary one that ksae-train --resume continues alone."""
from __future__ import annotations

from dataclasses import replace
import json

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.backend import CPU, resolve_device
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets import Dataset
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.checkpoint import load_checkpoint
from ksae_cupy.session.packed_runs import train_packed
from ksae_cupy.training.trainer import TrainConfig
from ksae_cupy.datasets.registry import DATASETS

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_cupy")]

# Three runs differing in seed, k, learning rate and batch size; two share k = 4 (one stack of two, a
# stack of one beside it; with batch sizes 100 and 80 they also meet at another batch size at epochs' ends).
CONFIGS = [dict(hidden=48, k=4, epochs=2, batch_size=100, lr=0.01, seed=1, k_start=None, topk="threshold"),
           dict(hidden=48, k=6, epochs=2, batch_size=100, lr=0.004, seed=2, k_start=None, topk="threshold"),
           dict(hidden=48, k=4, epochs=2, batch_size=80, lr=0.02, seed=3, k_start=None, topk="threshold")]


@pytest.fixture
def data(monkeypatch):
    """The built-in "synthetic" dataset cut to 600 / 150 signals of D = 32 (the stand-in's emulated
    kernels run a few thousand rows a second)."""
    X, _, _ = make_sparse_signals(750, D=32, H=64, k=4, seed=5)
    small = Dataset(name="synthetic", X_train=X[:600].astype(np.float32), X_valid=X[600:].astype(np.float32))
    monkeypatch.setitem(DATASETS, "synthetic", replace(DATASETS["synthetic"], load=lambda root, log=print: small))
    return small


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_close_runs(gpu_dir, cpu_dir) -> None:
    gpu, cpu = load_checkpoint(gpu_dir / "checkpoint.h5"), load_checkpoint(cpu_dir / "checkpoint.h5")
    assert (gpu.epoch, gpu.step) == (cpu.epoch, cpu.step)
    # float32 sums in another order for a dozen momentum steps: 1e-4 of each array's largest magnitude
    # bounds the rounding; a wrong kept set, order or rate is O(1).
    for name, value in cpu.params.items():
        scale = float(np.abs(value).max()) or 1.0
        np.testing.assert_allclose(gpu.params[name], value, rtol=0, atol=1e-4 * scale, err_msg=name)
        assert gpu.params[name].dtype == np.float32
    np.testing.assert_array_equal(gpu.units["since_kept_h"], cpu.units["since_kept_h"])
    for g, c in zip(metrics(gpu_dir), metrics(cpu_dir), strict=True):
        assert (g["epoch"], g["step"], g["k"], g["lr"]) == (c["epoch"], c["step"], c["k"], c["lr"])
        assert g["train_loss"] == pytest.approx(c["train_loss"], rel=1e-4)
        assert g["valid_loss"] == pytest.approx(c["valid_loss"], rel=1e-4)
        assert g["dead_fraction"] == c["dead_fraction"]


def test_a_pack_on_the_gpu_equals_each_run_alone_on_the_cpu(data, tmp_path):
    gpu = resolve_device("gpu")
    assert gpu.is_gpu
    gpu_dirs = [tmp_path / "gpu" / f"run{i}" for i in range(3)]
    lines = []
    outcomes = train_packed([TrainConfig(**c) for c in CONFIGS], data, gpu, gpu_dirs, settings={"threads": 1},
                            log=lines.append)
    assert [o.report.epoch for o in outcomes] == [2, 2, 2] and not any(o.diverged for o in outcomes)
    assert any(line.startswith("pack of 3 run(s), as one stacked model") for line in lines)
    for i, options in enumerate(CONFIGS):
        cpu_dir = tmp_path / "cpu" / f"run{i}"
        train_packed([TrainConfig(**options)], data, CPU, [cpu_dir], settings={"threads": 1}, log=lambda line: None)
        assert_close_runs(gpu_dirs[i], cpu_dir)
    # A packed GPU run goes on alone: ksae-train --resume on the GPU, as it would its own run.
    result = CliRunner().invoke(train_command, ["--resume", str(gpu_dirs[2]), "--epochs", "3", "--quiet"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert [line["epoch"] for line in metrics(gpu_dirs[2])] == [1, 2, 3]
    assert json.loads((gpu_dirs[2] / "config.json").read_text())["device"].startswith("gpu")


def test_ksae_sweep_on_the_gpu_packs_its_grid(data, tmp_path):
    """ksae-sweep --device gpu: no cluster, one stacked model for the grid; its rows within float32
    rounding of the same grid packed on the CPU (there bit for bit each run alone: tests/parallel)."""
    from ksae_cupy.cli.sweep import sweep_command

    grid = ["synthetic", "--k", "4,6", "--alpha", "1,2", "--hidden", "48", "--seeds", "0,1", "--epochs", "2",
            "--batch-size", "100", "--no-k-schedule"]
    rows, outputs = {}, {}
    for device, extra in (("gpu", []), ("cpu", ["--pack"])):
        result = CliRunner().invoke(sweep_command, [*grid, "--device", device, *extra, "--out",
                                                    str(tmp_path / device)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        rows[device], outputs[device] = json.loads((tmp_path / device / "results.json").read_text()), result.output
    assert "pack of 4 run(s), as one stacked model" in outputs["gpu"]
    assert "pack of 4 run(s), one after another" in outputs["cpu"]
    assert len(rows["gpu"]) == len(rows["cpu"]) == 8
    for g, c in zip(rows["gpu"], rows["cpu"]):
        assert (g["k"], g["seed"], g["alpha"], g["kept"]) == (c["k"], c["seed"], c["alpha"], c["kept"])
        for key in ("final_train_loss", "final_valid_loss", "valid_loss_alpha_k"):
            assert g[key] == pytest.approx(c[key], rel=1e-4), key
    assert load_checkpoint(tmp_path / "gpu" / "runs" / "h48-k6-seed1-e2" / "checkpoint.h5").epoch == 2


def test_the_packed_benchmark_validates_then_times(tmp_path, monkeypatch):
    """ksae-bench packed's measure (timings under the stand-in mean nothing; what it records and refuses does):
    a pack whose step is wrong is refused before any figure is written."""
    from ksae_cupy.bench.packed import bench_packed
    from ksae_cupy.errors import KsaeError
    from ksae_cupy.training import packed

    X, _, _ = make_sparse_signals(300, D=32, H=64, k=4, seed=5)
    gpu = resolve_device("gpu")
    result = bench_packed(X, gpu, runs=(1, 2), k=4, hidden=48, batch_size=100, epochs=1, out_dir=tmp_path,
                          log=lambda line: None)
    assert [(row["runs"], row["stacked"]) for row in result["packs"]] == [(1, True), (2, True)]
    assert all(row["epoch_s"] > 0 for row in result["packs"]) and json.loads(open(result["path"]).read())["k"] == 4

    def off_by_a_bit(W_mdh, b_mh, c_md, X_mnd, k, topk_method, activation):
        sq_error_m, grads, idx, val = stacked_loss_and_grads(W_mdh, b_mh, c_md, X_mnd, k, topk_method, activation)
        return sq_error_m * 1.01, grads, idx, val

    from ksae_cupy.packed_step import stacked_loss_and_grads

    monkeypatch.setattr(packed, "stacked_loss_and_grads", off_by_a_bit)
    with pytest.raises(KsaeError, match="pack of 1: the run of seed 0 lost"):
        bench_packed(X, gpu, runs=(1,), k=4, hidden=48, batch_size=100, epochs=1, out_dir=tmp_path / "wrong",
                     log=lambda line: None)
    assert not (tmp_path / "wrong").exists()


def test_a_stacked_step_reads_nothing_back_from_the_device(data, monkeypatch):
    """The stacked steps leave the GPU busy: no value comes back to the host until an epoch ends (the losses and
    per-unit counts are summed on the device), so the host launches the next step while the device works."""
    import cupy

    from ksae_cupy.training.packed import Pack
    from ksae_cupy.training.trainer import Trainer

    gpu = resolve_device("gpu")
    trainers = [Trainer(TrainConfig(**{**c, "epochs": 1}), gpu, D=32) for c in CONFIGS]
    pack = Pack(trainers)
    reads, inside = [], [False]
    for name in ("get", "item", "tolist", "__float__", "__int__", "__bool__", "__index__"):
        original = getattr(cupy.ndarray, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if inside[0]:
                reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cupy.ndarray, name, counted)
    stacked_step = Pack._stacked_step

    def watched(self, *args):
        inside[0] = True
        try:
            stacked_step(self, *args)
        finally:
            inside[0] = False

    monkeypatch.setattr(Pack, "_stacked_step", watched)
    X = gpu.asarray(data.X_train)
    pack.fit(X, gpu.asarray(data.X_valid))
    assert [t.step for t in trainers] == [6, 6, 8]  # 600 rows in batches of 100, 100 and 80
    assert reads == []
