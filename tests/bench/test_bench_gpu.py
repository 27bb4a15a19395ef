"""Small runs of the GPU benchmarks: on a GPU, and elsewhere against the CuPy stand-in (tests/cupy_standin),
where the timings mean nothing but every line of the benchmarks runs."""
from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_cupy")]


def test_bench_topk_small(tmp_path, gpu_cupy, monkeypatch):
    from ksae_cupy.bench import gpu
    from ksae_cupy.bench.gpu import bench_topk

    if getattr(gpu_cupy, "STANDIN", False):  # a 1 GiB copy measures nothing on the host: 16 MiB runs the code
        full = gpu.copy_bandwidth
        monkeypatch.setattr(gpu, "copy_bandwidth", lambda cupy: full(cupy, nbytes=1 << 24))

    out = bench_topk(Ns=(64,), Hs=(1000,), ks=(25,), repeats=5, out_dir=tmp_path)
    data = json.loads(open(out["path"]).read())
    names = {r["candidate"] for r in data["results"]}
    assert {"ksae_sort", "ksae_threshold", "cupy_argpartition", "cupy_sort"} <= names
    for r in data["results"]:
        if r["candidate"].startswith("ksae"):
            assert r["valid"] and r["median_ms"] > 0 and 0 < r["fraction_of_copy"]


def test_bench_train_small(tmp_path):
    from ksae_cupy.bench.gpu import bench_train_gpu

    # lr 0.003, not the benchmark's 0.01: on these 1,024 uniform samples lr 0.01 oscillates (NumPy:
    # first loss 127.3, last 191.0), so no GPU could pass the check below; with 0.003 the NumPy
    # run of the same steps ends the timed epoch at 38.2, under a third of the first loss.
    out = bench_train_gpu(n_samples=1024, epochs=1, lr=0.003, out_dir=tmp_path)
    for name, r in out["results"].items():
        assert "error" not in r, (name, r)
        assert r["steps_per_epoch"] == 8 and r["last_loss"] < r["first_loss"]
