"""``ksae-bench finetune``: the fine-tuning step, sparse against dense.
A subcommand of :mod:`ksae_cupy.cli.bench`'s group; validates before it times and writes JSON
under results/benchmarks/."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy import paper
from ksae_cupy.cli.common import positive_ints, report_errors
from ksae_cupy.errors import KsaeError
from ksae_cupy.topk import TOPK_METHODS


@click.command("finetune")
@click.option("--hidden", type=int, default=paper.HIDDEN, help="Units of every hidden layer.")
@click.option("--dim", type=int, default=784, show_default=True, help="Input dimensions D (MNIST: 784).")
@click.option("--classes", type=int, default=10, show_default=True, help="Output classes (MNIST: 10).")
@click.option("--kept", type=int, default=paper.KEPT,
              help=f"Units kept per hidden layer, alpha*k (paper, MNIST: {paper.ALPHA:g} x {paper.K}).")
@click.option("--layers", default="1,2", help="Comma-separated hidden-layer counts: one net of each is timed.")
@click.option("--batch-size", type=int, default=paper.BATCH_SIZE, show_default=True,
              help=f"Examples per step (the authors' code: {paper.BATCH_SIZE}).")
@click.option("--topk", type=click.Choice(TOPK_METHODS), default="sort", show_default=True,
              help="Top-k method: selection by sorting, or the iterative threshold (section 4.3.3).")
@click.option("--repeats", type=int, default=7, help="Timed repeats; the median is reported.")
@click.option("--steps", type=int, default=20, help="Steps per timed repeat.")
@click.option("--threads", type=int, default=1, help="BLAS and CPU kernel threads.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Results folder. [default: results/benchmarks]")
@report_errors
def bench_finetune(hidden, dim, classes, kept, layers, batch_size, topk, repeats, steps, threads, out):
    """Dense and sparse fine-tuning steps (phase all) of 784-1000-10 and 784-1000-1000-10 nets, on the CPU."""
    from ksae_cupy.backend import CPU
    from ksae_cupy.bench.finetune_cpu import bench_finetune_step
    from ksae_cupy.bench.metadata import RESULTS_DIR, write_results
    from ksae_cupy.paths import check_writable_folder

    for flag, value in (("--hidden", hidden), ("--dim", dim), ("--classes", classes), ("--kept", kept),
                        ("--batch-size", batch_size), ("--repeats", repeats), ("--steps", steps),
                        ("--threads", threads)):
        if value <= 0:
            raise KsaeError(f"{flag} {value} is not allowed; use a positive number")
    if kept > hidden:
        raise KsaeError(f"--kept {kept} is not allowed; use 1 <= kept <= hidden ({hidden})")
    if classes < 2:
        raise KsaeError(f"--classes {classes} is not allowed; use at least 2")
    check_writable_folder(out or RESULTS_DIR, "--out")
    click.echo(CPU.description)
    result = bench_finetune_step(CPU, D=dim, H=hidden, C=classes, kept=kept, layers=positive_ints(layers, "--layers"),
                                 batch_size=batch_size, topk_method=topk, repeats=repeats, steps=steps,
                                 threads=threads, log=click.echo)
    path = write_results("finetune-cpu", result, out)
    click.echo(f"results: {path}")
