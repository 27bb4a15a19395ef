"""``ksae-sweep``: train a grid of k-sparse autoencoders on a Dask cluster, or packed in one process; one
results table.

    ksae-sweep synthetic --k 5,10 --alpha 1,2 --hidden 128,256 --seeds 0,1 --epochs 20
    ksae-sweep data.npy --k 10 --scheduler tcp://head:8786 --out sweeps/s1
    ksae-sweep mnist --k 10,25,40 --seeds 0,1,2 --epochs 5000 --device gpu     # one launch, 9 runs packed

See :mod:`ksae_cupy.parallel.sweep` for what one grid point does.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from ksae_cupy.cli.version import version_option
from ksae_cupy.cli.common import GivenPath, STOP_SIGNALS, report_errors
from ksae_cupy.parallel.sweep import check_data, check_specs, run_packed, run_sweep, stopped_by_signals, write_results
from ksae_cupy.paths import check_writable_folder
from ksae_cupy.session.fields import PAPER  # the paper's defaults, typed once (TrainConfig)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@version_option
@click.argument("dataset")
@click.option("--k", "ks", default=str(PAPER.k), help="Comma-separated k values.")
@click.option("--alpha", "alphas", default=None,
              help="Comma-separated encoding multiples of k (scored per model). [default: 3, the paper's (hidden/k "
                   "where 3k exceeds the layer), the rule every command follows without an evaluation]")
@click.option("--hidden", "hiddens", default=str(PAPER.hidden), help="Comma-separated hidden sizes.")
@click.option("--seeds", default="0", help="Comma-separated seeds.")
@click.option("--epochs", "epochs", default="50", help="Comma-separated epoch counts.")
@click.option("--batch-size", type=int, default=PAPER.batch_size, help="Minibatch size of every training.")
@click.option("--lr", default=str(PAPER.lr),
              help="Learning rate of every training: a number (0.01 is the paper's for MNIST), or auto: derived "
                   "from the training data's scale on each worker, as ksae-train --lr auto does.")
@click.option("--threads", type=int, default=1,
              help="BLAS and CPU-kernel threads of each training (a worker runs one training at a time).")
@click.option("--no-k-schedule", is_flag=True,
              help="Train with k from the first epoch. [default: the schedule from k 100 (or k if larger, at most "
                   "the hidden size) down to k over the first half of the epochs]")
@click.option("--scheduler", default=None, help="Dask scheduler address. [default: a LocalCluster]")
@click.option("--workers", type=int, default=2, help="LocalCluster worker processes (one thread each).")
@click.option("--data-dir", default=None, help="Data root. [default: $KSAE_DATA_DIR or ./data]")
@click.option("--out", type=GivenPath(path_type=Path), default=Path("sweeps/latest"),
              help="Folder for results.json and results.md (and, packed, the runs' folders under OUT/runs).")
@click.option("--device", default="cpu",
              help="cpu, gpu, gpu:N or auto. On a GPU the grid trains packed, as one stacked model per hidden size.")
@click.option("--pack/--no-pack", default=None,
              help="Train the whole grid in this process as one pack of runs, each in its run folder under OUT/runs "
                   "(the same command again resumes them), instead of on a Dask cluster. [default: --pack on a "
                   "GPU, --no-pack on the CPU]")
@report_errors
def sweep_command(dataset, ks, alphas, hiddens, seeds, epochs, batch_size, lr, threads, no_k_schedule, scheduler,
                  workers, data_dir, out, device, pack):
    """Train a grid of k-sparse autoencoders on DATASET in parallel; write one results table."""
    from ksae_cupy.parallel.sweep_options import check_launch, specs_of

    on_gpu = device.startswith("gpu") or (device == "auto" and _gpu_answers())
    pack = on_gpu if pack is None else pack
    workers_given = click.get_current_context().get_parameter_source("workers").name != "DEFAULT"
    check_launch(device, on_gpu, pack, scheduler, workers, workers_given, threads)
    specs = specs_of(ks, alphas, hiddens, seeds, epochs, batch_size, lr, threads, no_k_schedule)
    check_specs(specs)  # here, in one line, not on a worker after a remote traceback
    check_writable_folder(out, "--out")  # before the trainings, not after them
    if pack:
        rows = _packed(specs, dataset, out, device, data_dir)
        json_path, md_path = write_results(rows, out)
        click.echo(md_path.read_text())
        click.echo(f"results: {json_path} {md_path}; runs: {out / 'runs'}")
        return
    if scheduler is None:  # the LocalCluster's workers read the files this process sees
        check_data(specs, dataset, data_dir)
    with stopped_by_signals() as received:
        try:
            rows = run_sweep(specs, dataset, scheduler=scheduler, workers=workers, data_dir=data_dir, log=click.echo)
        except KeyboardInterrupt:
            name = STOP_SIGNALS[signal.Signals(received[0]).name]
            click.echo(f"{name}: the sweep stopped; nothing was written to {out} (a sweep keeps no checkpoints: "
                       f"run it again to redo its trainings)", err=True)
            sys.exit(128 + received[0])
    json_path, md_path = write_results(rows, out)
    click.echo(md_path.read_text())
    click.echo(f"results: {json_path} {md_path}")


def _gpu_answers() -> bool:
    """Whether ``--device auto`` finds a GPU here."""
    from ksae_cupy.backend import resolve_device

    return resolve_device("auto").is_gpu


def _packed(specs, dataset, out: Path, device: str, data_dir) -> list[dict]:
    """The grid trained as one pack (:func:`ksae_cupy.parallel.sweep.run_packed`); a stop signal saves every run
    and exits with 128 + the signal, saying how to continue."""
    from ksae_cupy.session.packed_runs import PackStopped

    try:
        return run_packed(specs, dataset, out, device=device, data_dir=data_dir, log=click.echo)
    except PackStopped as stop:
        click.echo(f"the sweep stopped; every run saved its checkpoint under {out / 'runs'} "
                   f"({len(stop.unfinished)} unfinished); the same command again continues them", err=True)
        sys.exit(stop.status)


def main(argv=None):
    """Entry point ``ksae-sweep``."""
    sweep_command(args=argv, prog_name="ksae-sweep")
