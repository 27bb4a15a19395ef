"""``ksae-bench packed``: runs packed in one launch against one alone. A subcommand of
:mod:`ksae_cupy.cli.bench`'s group; validates before it times and writes JSON under results/benchmarks/."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy import paper
from ksae_cupy.cli.common import positive_ints, report_errors


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
