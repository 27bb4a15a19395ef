"""``python -m mpi4py -m ksae_cupy.cli.mpi_train train ...``: training over MPI ranks.

One process per rank, started by ``mpiexec``; see :mod:`ksae_cupy.parallel.data_parallel` for
how a step is split. A mistake (options, data, run folder, checkpoint) is one ``error:`` line
before any work, with every rank leaving together; an error one rank meets alone mid-run aborts
the whole job (``MPI_Abort``) with one line. ``--resume`` keeps every option of the run that is
not given again, applies those that may change mid-run and refuses, by name, those that would
change the model or its batches (as ``ksae-train --resume`` does).
"""
from __future__ import annotations

import contextlib
import os
import sys

import click

from ksae_cupy.cli.common import data_options, data_spec, flag_of, refuse_empty
from ksae_cupy.cli.options import declared, typed
from ksae_cupy.cli.version import VersionedGroup, version_option
from ksae_cupy.errors import KsaeError
from ksae_cupy.parallel.agree import abort_on_error, agree
from ksae_cupy.parallel.comm import COMMS
from ksae_cupy.parallel.sharded_topk import DIST_TOPK_METHODS
from ksae_cupy.parallel.distributed_run import run_distributed
from ksae_cupy.session import train_run
from ksae_cupy.session.fields import APPLIED, PAPER, TEXT_PATH, TRAIN, Option, options_class
from ksae_cupy.training.options import check_in_dtype

OPTIONS = {option.name: option for option in TRAIN}  # declared once, with ksae-train's
MPI_TRAIN = [  # the trainer's options, in --help's order: ksae-train's declarations where it shares them
    *(OPTIONS[name] for name in ("hidden", "k", "k_start", "no_k_schedule", "epochs")),
    OPTIONS["batch_size"].but(help="The GLOBAL minibatch, split over the ranks."),
    OPTIONS["lr"].but(help=f"Learning rate eta (paper: {PAPER.lr}).", default=PAPER.lr, type=float),
    *(OPTIONS[name] for name in ("momentum", "sigma", "topk", "seed", "dtype")),
    OPTIONS["device"].but(help="cpu, or gpu (GPU rank % GPUs per node) or gpu:N.", default="cpu"),
    Option("comm", "Gradient all-reduce: MPI on host buffers, or NCCL on GPU buffers.", "mpi", COMMS, APPLIED),
    Option("shard_hidden", "Split the hidden units (W's columns) over the ranks.", False, bool),
    Option("topk_dist", "With --shard-hidden: global top-k by all-reduced radix counts, or local top-k + all-gather.",
           "threshold", DIST_TOPK_METHODS, APPLIED),
    OPTIONS["run_dir"].but(type=TEXT_PATH),
    *(OPTIONS[name] for name in ("checkpoint_every", "overwrite")),
    OPTIONS["resume"].but(type=TEXT_PATH, help="Continue the run in this folder (same rank count); options given are "
                          "applied (--epochs, --topk, --device, --comm, --topk-dist, --checkpoint-every, --data-dir) "
                          "or, if they would change the model, refused by name."),
    OPTIONS["data_dir"].but(type=TEXT_PATH),
    OPTIONS["quiet"],
]
MpiTrainOptions = options_class("MpiTrainOptions", MPI_TRAIN)  # the trainer's values, by attribute


@click.group(cls=VersionedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@version_option
def main():
    """Multi-process training (run under mpiexec, one process per rank)."""


@main.command("train", context_settings={"show_default": True})
@click.argument("dataset", required=False)
@data_options
@declared(MPI_TRAIN)
@click.option("--fail-at-step", type=int, default=None, hidden=True, help="Fault injection for tests.")
@click.option("--fail-rank", type=int, default=1, hidden=True, help="The rank that fails (--fail-at-step).")
@click.option("--fail-mode", type=click.Choice(["raise", "exit"]), default="raise", hidden=True,
              help="How it fails: an exception, or the process exiting.")
@abort_on_error(spell=flag_of)
@typed(MpiTrainOptions)
def train(ctx, options: MpiTrainOptions, fail_at_step, fail_rank, fail_mode):
    """Train on DATASET with every rank of the MPI job."""
    from ksae_cupy.parallel.comm import world

    ranks = world()

    def new_config():  # the same on every rank
        refuse_empty(ctx.params)  # --run-dir '' would be the current folder
        if options.resume is None and "topk_dist" in options.given and not options.shard_hidden:
            raise KsaeError(f"--topk-dist {options.topk_dist} is not allowed without --shard-hidden: it chooses how "
                            f"ranks holding parts of the hidden layer find the top-k; add --shard-hidden or drop it")
        if options.resume is not None:
            return None, None
        config = train_run.new_config(options, options.lr)  # as ksae-train's, validated once
        check_in_dtype(options.dtype, **{"--lr": ("rate", options.lr)})  # a rate of 0 in the dtype trains nothing
        if options.dataset is None:
            raise KsaeError("missing DATASET; give a dataset name or file, or --resume RUN_DIR")
        return config, data_spec(options.dataset, options)  # DATASET with its labels and splits, by absolute paths

    config, spec = agree(ranks, new_config)
    fail = (fail_at_step, fail_mode) if fail_at_step is not None and ranks.rank == fail_rank else None
    run_distributed(options, config, spec, fail_at_step=fail, log=lambda *a, **kw: click.echo(*a, **kw))


# How the trainer is started (there is no console script of it): its usage line and help say so.
PROG_NAME = "mpiexec -n R python -m mpi4py -m ksae_cupy.cli.mpi_train"


def run(argv=None):
    """Entry point: ``python -m mpi4py -m ksae_cupy.cli.mpi_train train ...``.

    Help and a mistyped command line are shown once (rank 0), not once per rank, and every rank
    leaves with click's status together."""
    from ksae_cupy.parallel.agree import _exit_together, _rank

    first = _rank() in (0, "?")
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(sys.stdout if first else devnull):
        try:
            main.main(args=argv, prog_name=PROG_NAME, standalone_mode=False)
        except click.ClickException as exc:
            if first:
                exc.show()
            _exit_together(exc.exit_code)
        except click.exceptions.Abort:
            _exit_together(1)

if __name__ == "__main__":
    run()
