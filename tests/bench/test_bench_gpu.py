"""Small runs of the top-k benchmark (the training epochs': test_bench_train_gpu.py): on a GPU, and elsewhere
against the CuPy stand-in (tests/cupy_standin), where the timings mean nothing but every line of it runs."""
from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_cupy")]


def test_bench_topk_small(tmp_path, gpu_cupy):
    from ksae_cupy.bench.gpu import OUR_KERNELS, bench_topk, topk_bytes

    # A 1 GiB copy measures nothing on the stand-in: 16 MiB runs the same code.
    copy_bytes = 1 << 24 if getattr(gpu_cupy, "STANDIN", False) else 1 << 30
    # H = 1000 packs 8 rows a block in the radix kernels at N = 4096 and 1 at N = 64; k = 1000 is not < H.
    out = bench_topk(Ns=(64,), Hs=(1000, 2048), ks=(25, 1000), repeats=5, out_dir=tmp_path, copy_bytes=copy_bytes)
    data = json.loads(open(out["path"]).read())
    assert data["meta"]["commit"] and data["meta"]["date"] and data["meta"]["device"]
    assert data["copy"]["GBps"] > 0 and data["copy"]["bytes"] == copy_bytes
    rows = {(r["H"], r["k"], r["candidate"]): r for r in data["results"]}
    assert {(r["H"], r["k"]) for r in data["results"]} == {(1000, 25), (2048, 25), (2048, 1000)}
    for name, _method, _variant in OUR_KERNELS:
        for H, k in [(1000, 25), (2048, 25), (2048, 1000)]:
            r = rows[(H, k, name)]
            assert r["valid"] and r["median_ms"] > 0 and 0 < r["fraction_of_copy"], r
            assert r["bytes"] == topk_bytes(64, H, k) == 64 * H * 4 + 64 * k * 8
            assert r["bytes_per_s"] == pytest.approx(r["bytes"] / (r["median_ms"] * 1e-3))
    assert rows[(1000, 25, "cupy_argpartition")]["valid"]
    torch_rows = [r for r in data["results"] if r["candidate"].startswith("torch_topk")]
    if data["torch"] is None:  # the stand-in has no torch with CUDA: recorded absent, never timed
        assert not torch_rows and "torch" in data["absent"]
    else:
        assert {r["candidate"] for r in torch_rows} == {"torch_topk_sorted", "torch_topk_unsorted"}
    if not any(r["candidate"] == "raft_select_k" for r in data["results"]):
        assert "raft_select_k" in data["absent"]


def test_bench_topk_skips_what_does_not_fit(tmp_path, gpu_cupy):
    """Shapes whose input would take more than a third of the free memory, and shapes past the time
    budget, are recorded as skipped, never half-run."""
    from ksae_cupy.bench.gpu import bench_topk

    free, _ = gpu_cupy.cuda.runtime.memGetInfo()
    huge_N = free // (3 * 4 * 1000) + 1
    out = bench_topk(Ns=(huge_N,), Hs=(1000,), ks=(25, 150), repeats=5, out_dir=tmp_path, copy_bytes=1 << 20)
    assert out["results"] == [] and [s["k"] for s in out["skipped"]] == [25, 150]
    assert "more than a third" in out["skipped"][0]["skipped"]
    out = bench_topk(Ns=(8,), Hs=(100,), ks=(5,), repeats=5, write=False, copy_bytes=1 << 20, time_budget_s=-1.0)
    assert out["results"] == [] and "time budget" in out["skipped"][0]["skipped"]
