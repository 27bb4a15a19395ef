"""``ksae-bench``: the benchmarks (training step, fine-tuning step, top-k kernels, distributed step).

Each validates before it times and writes JSON under results/benchmarks/.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from ksae_cupy import paper
from ksae_cupy.cli.version import VersionedGroup, version_option
from ksae_cupy.cli.common import positive_ints, report_errors
from ksae_cupy.errors import KsaeError
from ksae_cupy.bench.train_cpu import ENCODER_CHOICES
from ksae_cupy.topk import TOPK_METHODS


@click.group(cls=VersionedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@version_option
def bench_command():
    """Benchmarks; each validates before it times and writes JSON under results/benchmarks/."""


@bench_command.command("train")
@click.option("--device", default="cpu",
              help="cpu, or gpu / gpu:N (then: seconds per MNIST epoch, fresh and trained model, ours vs PyTorch).")
@click.option("--hidden", type=int, default=paper.HIDDEN, show_default=True,
              help=f"Hidden units H (the paper's MNIST net: {paper.HIDDEN}).")
@click.option("--dim", type=int, default=784, show_default=True, help="Input dimensions D (MNIST: 784).")
@click.option("--k", "k", type=int, default=paper.K, show_default=True, help="Units kept per example (the paper's best MNIST k).")
@click.option("--batch-size", type=int, default=paper.BATCH_SIZE, show_default=True,
              help=f"Examples per step (the authors' code: {paper.BATCH_SIZE}).")
@click.option("--topk", type=click.Choice(TOPK_METHODS), default="sort", show_default=True,
              help="Top-k method: selection by sorting, or the iterative threshold (section 4.3.3).")
@click.option("--repeats", type=int, default=7, help="Timed repeats; the median is reported.")
@click.option("--steps", type=int, default=50, help="Steps per timed repeat.")
@click.option("--threads", type=int, default=1, show_default=True,
              help="BLAS, kernel and torch threads for every contender (CPU); 2 or more runs the sparse step in lanes.")
@click.option("--k-sweep", default="", help="Comma-separated k values to time too, e.g. 10,25,40,70,100,250 (CPU).")
@click.option("--no-torch", is_flag=True, help="Leave the PyTorch step out even when torch imports.")
@click.option("--epoch-k", default="",
              help="Comma-separated k values at which to time a whole 50,000-image epoch and its parts, e.g. 100,25 (CPU).")
@click.option("--encoder", type=click.Choice(ENCODER_CHOICES), default="both", show_default=True,
              help="X W of the sparse step (CPU kernels), timed on MNIST batches: BLAS's (dense), from the non-zero "
                   "inputs (sparse), chosen by density (auto), or dense and sparse side by side (both).")
@click.option("--epoch-repeats", type=int, default=3, show_default=True,
              help="Epochs timed per encoder and k of --epoch-k, interleaved (GPU: per contender); the median is reported.")
@click.option("--trained-epochs", type=click.IntRange(min=0), default=10, show_default=True,
              help="Time a model trained this many epochs here (paper's rate, k fixed) beside the fresh one; "
                   "0: the fresh model only.")
@click.option("--from-run", type=click.Path(path_type=Path), default=None,
              help="Time the trained model of this run folder (its checkpoint.h5) instead of training one here. "
                   "[default: a model trained here, --trained-epochs]")
@click.option("--rows", type=click.IntRange(min=1), default=None, help="GPU: train on the first ROWS images. [default: 50,000]")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Results folder. [default: results/benchmarks]")
@report_errors
def bench_train(device, hidden, dim, k, batch_size, topk, repeats, steps, threads, k_sweep, no_torch, epoch_k, encoder,
                epoch_repeats, trained_epochs, from_run, rows, out):
    """Dense step, sparse step, PyTorch and the encoder product X W alone, on MNIST shapes."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.bench import trained
    from ksae_cupy.bench.train_cpu import bench_train_step
    from ksae_cupy.bench.metadata import RESULTS_DIR, write_results
    from ksae_cupy.paths import check_writable_folder
    from ksae_cupy.training.options import check_training_memory

    for flag, value in (("--hidden", hidden), ("--dim", dim), ("--batch-size", batch_size), ("--repeats", repeats),
                        ("--steps", steps), ("--threads", threads), ("--epoch-repeats", epoch_repeats)):
        if value <= 0:
            raise KsaeError(f"{flag} {value} is not allowed; use a positive number")
    sweep = positive_ints(k_sweep, "--k-sweep") if k_sweep else []
    epoch_ks = positive_ints(epoch_k, "--epoch-k") if epoch_k else []
    for kk in [k, *sweep, *epoch_ks]:
        if not 1 <= kk <= hidden:
            raise KsaeError(f"k {kk} is not allowed; use 1 <= k <= hidden ({hidden})")
    check_writable_folder(out or RESULTS_DIR, "--out")
    start = trained.from_run(from_run, dim, hidden) if from_run is not None else None
    backend = resolve_device(device)
    check_training_memory(backend, dim, hidden, batch_size, "float64")  # the validation runs in float64
    click.echo(backend.description)
    if backend.is_gpu:
        from ksae_cupy.bench.train_gpu import bench_train_gpu

        result = bench_train_gpu(backend, D=dim, H=hidden, k=k, batch=batch_size, topk=topk, epochs=epoch_repeats,
                                 trained_epochs=trained_epochs, from_run=start, rows=rows, include_torch=not no_torch,
                                 out_dir=out, log=click.echo)
        click.echo(json.dumps({key: value for key, value in result.items() if key != "meta"}, indent=1, default=str))
        return
    result = bench_train_step(backend, D=dim, H=hidden, k=k, batch_size=batch_size, topk_method=topk,
                              repeats=repeats, steps=steps, threads=threads, k_sweep=sweep,
                              with_torch=not no_torch, epoch_ks=epoch_ks, log=click.echo, encoder=encoder,
                              epoch_repeats=epoch_repeats, trained_epochs=trained_epochs, from_run=start)
    path = write_results(f"train-{backend.name.replace(':', '')}", result, out)
    click.echo(f"results: {path}")


# The other benchmarks live in modules of their own: subcommands all the same.
from ksae_cupy.cli.bench_dist import bench_dist_command  # noqa: E402
from ksae_cupy.cli.bench_finetune import bench_finetune  # noqa: E402
from ksae_cupy.cli.bench_gpu import bench_packed_command, bench_topk_command  # noqa: E402

bench_command.add_command(bench_finetune, "finetune")
bench_command.add_command(bench_dist_command, "dist")
bench_command.add_command(bench_topk_command, "topk")
bench_command.add_command(bench_packed_command, "packed")
