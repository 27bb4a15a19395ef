"""``ksae-bench dist``: the data-parallel and hidden-sharded steps over MPI ranks.
A subcommand of :mod:`ksae_cupy.cli.bench`'s group; validates before it times and writes JSON
under results/benchmarks/."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy import paper
from ksae_cupy.cli.common import positive_ints, report_errors
from ksae_cupy.errors import KsaeError


@click.command("dist")
@click.option("--ranks", default="1,2,3", help="Comma-separated rank counts; one MPI job each (more ranks than cores oversubscribe).")
@click.option("--threads", type=int, default=1, help="BLAS threads per rank.")
@click.option("--baseline-threads", type=int, default=None,
              help="Also time one rank with this many BLAS threads (0: no). [default: the CPU count]")
@click.option("--hidden", type=int, default=paper.HIDDEN, show_default=True,
              help=f"Hidden units H (the paper's MNIST net: {paper.HIDDEN}).")
@click.option("--dim", type=int, default=784, show_default=True, help="Input dimensions D (MNIST: 784).")
@click.option("--k", "k", type=int, default=paper.K, show_default=True, help="Units kept per example (the paper's best MNIST k).")
@click.option("--batch-size", type=int, default=paper.BATCH_SIZE, help="The GLOBAL minibatch, split over the ranks.")
@click.option("--topk-k", "topk_ks", default="25,250", help="Comma-separated k values for the sharded top-k.")
@click.option("--formula-ranks", default="1,2,4,8,16", help="Rank counts of the computed traffic table.")
@click.option("--repeats", type=int, default=7, help="Timed repeats; the median is reported.")
@click.option("--steps", type=int, default=20, help="Steps per timed repeat.")
@click.option("--topk-repeats", type=int, default=21, help="Timed calls of each sharded top-k.")
@click.option("--mpiexec", default=None, help="[default: the mpiexec beside this Python, else on PATH]")
@click.option("--timeout", type=float, default=600.0, help="Seconds each MPI job may run.")
@click.option("--note", default="", help="A line for the Markdown summary (e.g. that the machine was shared).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Results folder. [default: results/benchmarks]")
@report_errors
def bench_dist_command(ranks, threads, baseline_threads, hidden, dim, k, batch_size, topk_ks, formula_ranks,
                       repeats, steps, topk_repeats, mpiexec, timeout, note, out):
    """Data-parallel step vs one process, all-reduce time, and sharded top-k traffic (MPI, CPU)."""
    import os

    from ksae_cupy.bench.distributed import bench_dist, markdown
    from ksae_cupy.bench.metadata import write_results

    for flag, value in (("--threads", threads), ("--hidden", hidden), ("--dim", dim), ("--batch-size", batch_size),
                        ("--repeats", repeats), ("--steps", steps), ("--topk-repeats", topk_repeats)):
        if value <= 0:
            raise KsaeError(f"{flag} {value} is not allowed; use a positive number")
    if baseline_threads is None:
        baseline_threads = os.cpu_count() or 1
    if baseline_threads < 0:
        raise KsaeError(f"--baseline-threads {baseline_threads} is not allowed; use 0 (none) or a positive number")
    result = bench_dist(ranks=positive_ints(ranks, "--ranks"), threads=threads, baseline_threads=baseline_threads,
                        D=dim, H=hidden, N=batch_size, k=k, topk_ks=positive_ints(topk_ks, "--topk-k"),
                        formula_ranks=positive_ints(formula_ranks, "--formula-ranks"), repeats=repeats, steps=steps,
                        topk_repeats=topk_repeats, mpiexec=mpiexec, timeout=timeout, log=click.echo)
    path = write_results("dist-cpu", result, out)
    summary = markdown(result, note)
    path.with_suffix(".md").write_text(summary)
    click.echo(summary)
    click.echo(f"results: {path} and {path.with_suffix('.md')}")
