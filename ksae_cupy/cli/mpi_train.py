"""``python -m mpi4py -m ksae_cupy.cli.mpi_train train ...``: training over MPI ranks.

One process per rank, started by ``mpiexec``; see :mod:`ksae_cupy.parallel.data_parallel` for
how a step is split. Any error on any rank aborts the whole job (``MPI_Abort``).
"""
from __future__ import annotations

import click

from ksae_cupy.errors import KsaeError
from ksae_cupy.parallel.data_parallel import abort_on_error, run_distributed
from ksae_cupy.schedules import resolve_k_start
from ksae_cupy.training.trainer import TrainConfig


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Multi-process training (run under mpiexec, one process per rank)."""


@main.command("train", context_settings={"show_default": True})
@click.argument("dataset", required=False)
@click.option("--hidden", type=int, default=1000)
@click.option("--k", "k", type=int, default=25)
@click.option("--k-start", type=int, default=None, help="[default: 100, or k if larger, at most hidden]")
@click.option("--no-k-schedule", is_flag=True)
@click.option("--epochs", type=int, default=5000)
@click.option("--batch-size", type=int, default=128, help="The GLOBAL minibatch, split over the ranks.")
@click.option("--lr", type=float, default=0.01)
@click.option("--momentum", type=float, default=0.9)
@click.option("--sigma", type=float, default=0.01)
@click.option("--topk", type=click.Choice(["sort", "threshold"]), default="sort")
@click.option("--seed", type=int, default=0)
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32")
@click.option("--device", default="cpu", help="cpu, or gpu (GPU rank % GPUs per node) or gpu:N.")
@click.option("--comm", "comm_kind", type=click.Choice(["mpi", "nccl"]), default="mpi",
              help="Gradient all-reduce: MPI on host buffers, or NCCL on GPU buffers.")
@click.option("--shard-hidden", is_flag=True, help="Split the hidden units (W's columns) over the ranks.")
@click.option("--topk-dist", type=click.Choice(["threshold", "gather"]), default="threshold",
              help="With --shard-hidden: global top-k by all-reduced radix counts, or local top-k + all-gather.")
@click.option("--run-dir", type=click.Path(), default=None)
@click.option("--checkpoint-every", type=int, default=10)
@click.option("--resume", type=click.Path(), default=None)
@click.option("--data-dir", type=click.Path(), default=None)
@click.option("--quiet", is_flag=True)
@click.option("--fail-at-step", type=int, default=None, hidden=True, help="Fault injection for tests.")
@click.option("--fail-rank", type=int, default=1, hidden=True)
@click.option("--fail-mode", type=click.Choice(["raise", "exit"]), default="raise", hidden=True)
@abort_on_error
def train(dataset, hidden, k, k_start, no_k_schedule, epochs, batch_size, lr, momentum, sigma, topk, seed,
          dtype, device, comm_kind, shard_hidden, topk_dist, run_dir, checkpoint_every, resume, data_dir,
          quiet, fail_at_step, fail_rank, fail_mode):
    """Train on DATASET with every rank of the MPI job."""
    from ksae_cupy.parallel.comm import world

    if checkpoint_every <= 0:
        raise KsaeError(f"--checkpoint-every {checkpoint_every} is not allowed; use a positive number of epochs")
    config = TrainConfig(hidden=hidden, k=k, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                         sigma=sigma, topk=topk, seed=seed, dtype=dtype,
                         k_start=None if no_k_schedule else resolve_k_start(
                             k_start if k_start is not None else "auto", k, hidden))
    fail = (fail_at_step, fail_mode) if fail_at_step is not None and world().rank == fail_rank else None
    run_distributed(dataset, config, run_dir=run_dir, resume=resume, device=device, comm_kind=comm_kind,
                    checkpoint_every=checkpoint_every, data_dir=data_dir, quiet=quiet,
                    shard_hidden=shard_hidden, topk_dist=topk_dist, fail_at_step=fail,
                    log=lambda *a, **kw: click.echo(*a, **kw))


def run(argv=None):
    """Entry point: ``python -m mpi4py -m ksae_cupy.cli.mpi_train train ...``."""
    main(args=argv, prog_name="ksae-dist")


if __name__ == "__main__":
    run()
