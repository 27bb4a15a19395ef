"""``ksae-bench topk`` and ``ksae-bench packed``: our top-k kernels against the libraries' on a GPU, and runs
packed in one launch against one alone. Subcommands of :mod:`ksae_cupy.cli.bench`'s group; each validates before
it times and writes JSON under results/benchmarks/."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy import paper
from ksae_cupy.cli.common import positive_ints, report_errors
from ksae_cupy.errors import KsaeError


@click.command("topk")
@click.option("--device", default="gpu", help="gpu or gpu:N.")
@click.option("--N", "Ns", default="128,4096,65536", help="Comma-separated batch sizes.")
@click.option("--H", "Hs", default="1000,4000,16384,65536", help="Comma-separated row lengths.")
@click.option("--k", "ks", default="25,150,1000", help="Comma-separated k values (shapes with k >= H are left out).")
@click.option("--repeats", type=int, default=50, show_default=True, help="Timed repeats; the median is reported.")
@click.option("--no-torch", is_flag=True, help="Leave torch.topk out even when torch imports.")
@click.option("--time-budget", type=click.FloatRange(min=0), default=420.0, show_default=True,
              help="Seconds after which no new shape starts (the rest are recorded as skipped).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Results folder. [default: results/benchmarks]")
@report_errors
def bench_topk_command(device, Ns, Hs, ks, repeats, no_torch, time_budget, out):
    """Our top-k kernels (block and radix) against CuPy, torch.topk (sorted, unsorted) and RAFT, validated then timed."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.bench.gpu import bench_topk

    backend = resolve_device(device)
    if not backend.is_gpu:
        raise KsaeError(f"--device {device}: ksae-bench topk times CUDA kernels; use --device gpu[:N]")
    click.echo(backend.description)
    parse = lambda text, flag: tuple(positive_ints(text, flag))
    result = bench_topk(Ns=parse(Ns, "--N"), Hs=parse(Hs, "--H"), ks=parse(ks, "--k"), repeats=repeats,
                        device=backend.gpu_index, include_torch=not no_torch, out_dir=out, time_budget_s=time_budget)
    click.echo(f"results: {result.get('path')}")


@click.command("packed")
@click.option("--device", default="gpu", help="gpu, gpu:N or cpu (on the CPU a pack runs its runs one after another).")
@click.option("--runs", default="1,4,16", show_default=True, help="Comma-separated pack sizes.")
@click.option("--k", type=int, default=paper.K, show_default=True, help="Units kept.")
@click.option("--epochs", type=int, default=3, show_default=True, help="Timed epochs (after one untimed).")
@click.option("--rows", type=int, default=None, help="Train on the first ROWS of MNIST's training set. [default: all]")
@click.option("--data-dir", default=None, help="Data root. [default: $KSAE_DATA_DIR or ./data]")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Results folder. [default: results/benchmarks]")
@report_errors
def bench_packed_command(device, runs, k, epochs, rows, data_dir, out):
    """Seconds per MNIST epoch of R runs packed in one launch, against one run alone (validated, then timed)."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.bench.packed import bench_packed
    from ksae_cupy.datasets import load_dataset

    backend = resolve_device(device)
    click.echo(backend.description)
    X_nd = load_dataset("mnist", root=data_dir, log=lambda msg: None).X_train
    result = bench_packed(X_nd[:rows] if rows else X_nd, backend, runs=tuple(positive_ints(runs, "--runs")), k=k,
                          epochs=epochs, out_dir=out, log=click.echo)
    click.echo(f"results: {result['path']}")
