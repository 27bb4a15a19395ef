"""``ksae-plot``: the paper's figures from trained runs (filters, hidden-activity histograms) and
a run's training curves."""
from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from ksae_cupy.cli.version import VersionedGroup, version_option
from ksae_cupy.cli.common import (GivenPath, CONTEXT, DATA_DIR, QUIET, RUN_DIR,
                                   dataset_split, progress_printer, report_errors)
from ksae_cupy.cli.run_options import SPLITS
from ksae_cupy.evaluation.plots import LAYOUTS
from ksae_cupy.errors import KsaeError
from ksae_cupy.session.outputs import OVERWRITE_HELP

# -o names a file the user chose: an existing one is replaced only with --overwrite (the default, the
# command's own file in the run folder, is replaced as a plot made again)
OVERWRITE = click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)


HIST_WIDTH = 800  # pixels: save_activity_histograms' default size

@click.group(cls=VersionedGroup, context_settings=CONTEXT)
@version_option
def plot_command():
    """Draw the paper's figures from trained runs (needs: pip install ksae-cupy[plot])."""


@plot_command.command("filters", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("-o", "--output", type=GivenPath(path_type=Path), default=None, help="Image file; its suffix picks the format (png, pdf, svg, jpg, ...). [default: RUN_DIR/filters.png]")
@click.option("--n", "n_filters", type=int, default=None, help="Draw the first N filters. [default: all]")
@click.option("--skip-dead", is_flag=True,
              help="Leave out the dead units (non-zero in no training example's k-code: their filters are "
                   "noise); reads the run's units.json, else its dataset.")
@click.option("--cols", type=int, default=None, help="Filters per row. [default: square grid]")
@click.option("--shape", default=None,
              help="Filter image shape HxW. [default: the run's dataset's, else square, sqrt(D / channels)]")
@click.option("--channels", type=click.Choice(["1", "3"]), default=None,
              help="1: grey; 3: colour patches. [default: the run's dataset's, else 1]")
@click.option("--layout", type=click.Choice(LAYOUTS), default="hwc", help="Order of a colour filter's values.")
@click.option("--scale", type=int, default=2, help="Pixels per filter pixel.")
@DATA_DIR
@QUIET
@OVERWRITE
@report_errors
def plot_filters(run_dir, output, n_filters, skip_dead, cols, shape, channels, layout, scale, data_dir, quiet,
                 overwrite):
    """Each column of W as an image, in a grid (the paper's Figures 1-3: MNIST, NORB, CIFAR-10 patches)."""
    from ksae_cupy.evaluation.features import open_run
    from ksae_cupy.evaluation.plots import (check_image_output, filters_drawn, parse_image_shape, require_matplotlib,
                                            save_filter_grid)

    require_matplotlib()
    run = open_run(run_dir)
    check_image_output(output or run.path / "filters.png", runs=[run_dir], overwrite=overwrite or output is None)
    output = output or run.path / "filters.png"
    image_shape, channels = parse_image_shape(shape), None if channels is None else int(channels)
    if image_shape is None and channels is None:  # draw the run's dataset as it is laid out
        from ksae_cupy.datasets.registry import DATASETS

        known = DATASETS[run.dataset].image_shape if run.dataset in DATASETS else None
        if known is not None and known[0] * known[1] * (known[2] if len(known) == 3 else 1) == run.params["W_dh"].shape[0]:
            image_shape, channels = known[:2], (known[2] if len(known) == 3 else 1)
    if (channels or 1) == 1 and click.get_current_context().get_parameter_source("layout").name != "DEFAULT":
        raise KsaeError(f"--layout {layout} has no effect on grey filters (one channel); it orders a colour "
                        f"filter's values: give --channels 3, or leave --layout out")
    W_dh, left_out = run.params["W_dh"], ""
    if skip_dead:
        W_dh, left_out = _live_filters(run, data_dir, progress_printer(quiet))
    drawn = filters_drawn(W_dh.shape[1], n_filters)
    width, height = save_filter_grid(W_dh, output, image_shape, channels or 1, layout, n_filters, cols, scale)
    click.echo(f"wrote {output} ({width}x{height} pixels, k={run.k}, {drawn} of {run.H} filters{left_out})")


def _live_filters(run, data_dir, say):
    """``(W_dh of the live units, "; N dead left out" words)``: dead as every command counts it
    (:data:`~ksae_cupy.metrics.DEAD_DEFINITION`; the run's units.json, else measured on its training rows)."""
    counts_h = run_firing_counts(run, data_dir, say)[0]
    dead_h = counts_h == 0
    n_dead = int(dead_h.sum())
    if n_dead == run.H:
        raise KsaeError(f"all {run.H} units are dead (kept by no training example): no filter to draw")
    return run.params["W_dh"][:, ~dead_h], f"; {n_dead} dead left out: non-zero in no training example's k-code"


def run_firing_counts(run, data_dir, say):
    """``(counts_h, rows)``: each unit's firing count on the run's training rows: the run's units.json when it
    belongs to the checkpoint, else measured here from the run's dataset (the same function)."""
    from ksae_cupy.metrics import firing_counts
    from ksae_cupy.training.unit_counts import read_unit_counts

    kept = read_unit_counts(run.path, run.ckpt.step)
    if kept is not None:
        return np.asarray(kept["firing_counts"]), int(kept["rows"])
    from ksae_cupy.evaluation.features import load_run_dataset

    X_nd = load_run_dataset(run, data_dir, say).X_train
    params = run.params
    counts_h = firing_counts(params, X_nd.astype(params["W_dh"].dtype), run.k,
                             run.ckpt.config.get("activation", "linear"))
    return counts_h, int(X_nd.shape[0])


@plot_command.command("firing", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("-o", "--output", type=GivenPath(path_type=Path), default=None,
              help="Image file; its suffix picks the format. [default: RUN_DIR/firing.png]")
@DATA_DIR
@QUIET
@OVERWRITE
@report_errors
def plot_firing(run_dir, output, data_dir, quiet, overwrite):
    """Histogram (density) of log10 firing frequency per unit: how often each unit is non-zero in the
    training rows' k-codes; dead units (never) are counted in the legend. Reads RUN_DIR/units.json (written at
    the end of ksae-train), else the run's dataset."""
    from ksae_cupy.evaluation.features import open_run
    from ksae_cupy.evaluation.plots import check_image_output, require_matplotlib, save_firing_histogram

    require_matplotlib()
    check_image_output(output or Path(run_dir) / "firing.png", runs=[run_dir], overwrite=overwrite or output is None)
    output = output or Path(run_dir) / "firing.png"
    run = open_run(run_dir)
    counts_h, rows = run_firing_counts(run, data_dir, progress_printer(quiet))
    n_dead = int((counts_h == 0).sum())
    width, height = save_firing_histogram(counts_h, rows, output,
                                          title=f"{run.path.name}: k {run.k}, {run.H} units, {n_dead} dead")
    click.echo(f"wrote {output} ({width}x{height} pixels, {run.H} units, {n_dead} dead: non-zero in no training "
               f"example's k-code)")


@plot_command.command("hist", context_settings=CONTEXT)
@click.argument("run_dirs", type=RUN_DIR, nargs=-1, required=True)
@click.option("-o", "--output", type=GivenPath(path_type=Path), default=None,
              help="Image file; its suffix picks the format. [default: the first RUN_DIR's activity-histogram.png]")
@click.option("--n-samples", type=int, default=1000, help="Rows of the split to encode per run.")
@click.option("--split", type=click.Choice(SPLITS), default="test", help="Split whose rows are encoded.")
@click.option("--alpha", type=float, default=1.0, help="Encode with the alpha*k largest units.")
@click.option("--bins", type=int, default=100, help="Histogram bins.")
@DATA_DIR
@QUIET
@OVERWRITE
@report_errors
def plot_hist(run_dirs, output, n_samples, split, alpha, bins, data_dir, quiet, overwrite):
    """Histogram of hidden activities for one or more runs (the paper's Figure 4).

    Compare sparsity levels by passing several runs, e.g. k=70, k=15 and a dense linear
    autoencoder (the same trainer with --k equal to --hidden).
    """
    from ksae_cupy.evaluation.features import load_run_dataset, open_run
    from ksae_cupy.model import encode
    from ksae_cupy.evaluation.plots import check_image_output, require_matplotlib, save_activity_histograms

    require_matplotlib()
    check_image_output(output or Path(run_dirs[0]) / "activity-histogram.png", runs=run_dirs,
                       overwrite=overwrite or output is None)
    output = output or Path(run_dirs[0]) / "activity-histogram.png"  # into the run folder, as the other plots
    if n_samples < 1 or bins < 1:
        raise KsaeError("--n-samples and --bins must be positive")
    if bins > HIST_WIDTH:  # more bins than pixels draws nothing more (and 10^9 of them fill the memory)
        raise KsaeError(f"--bins {bins} is not allowed; use 1 to {HIST_WIDTH} (the plot is {HIST_WIDTH} pixels wide)")
    say = progress_printer(quiet)
    activities, datasets = {}, {}
    for run_dir in run_dirs:
        run = open_run(run_dir)
        if run.dataset not in datasets:
            datasets[run.dataset] = load_run_dataset(run, data_dir, say)
        X_nd = dataset_split(datasets[run.dataset], split)[0][:n_samples]
        label = f"k={run.k}" + (" (dense)" if run.k == run.H else "") + f" [{run.path.name}]"
        activities[label] = encode(run.params, X_nd.astype(run.params["W_dh"].dtype), run.k, alpha,
                                   activation=run.ckpt.config.get("activation", "linear"))
        say(f"encoded {len(X_nd)} {split} rows with {label}")
    save_activity_histograms(activities, output, bins=bins)
    click.echo(f"wrote {output}")


@plot_command.command("curves", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("-o", "--output", type=GivenPath(path_type=Path), default=None,
              help="Image file; its suffix picks the format. [default: RUN_DIR/curves.png]")
@OVERWRITE
@report_errors
def plot_curves(run_dir, output, overwrite):
    """Training and validation loss and k, FVE and dead units over the epochs of a run (from its metrics.jsonl)."""
    from ksae_cupy.evaluation.plots import (check_image_output, check_training_records, require_matplotlib,
                                            save_training_curves)
    from ksae_cupy.session.runs import RunFolder

    require_matplotlib()
    if Path(run_dir).is_file():  # before its default output, run_dir/curves.png, is named as unwritable
        raise KsaeError(f"{run_dir} is a file, not a run folder; give the folder that holds metrics.jsonl")
    check_image_output(output or Path(run_dir) / "curves.png", runs=[run_dir], overwrite=overwrite or output is None)
    output = output or Path(run_dir) / "curves.png"
    metrics = RunFolder(run_dir).read_metrics()
    check_training_records(metrics, Path(run_dir) / "metrics.jsonl")
    last = metrics[-1] if metrics else None
    title = (f"{Path(run_dir).name}: {last['epoch']} epochs, k {metrics[0]['k']} -> {last['k']}, "
             f"valid loss {last['valid_loss']:.4f}" if last and last.get("valid_loss") is not None else "")
    width, height = save_training_curves(metrics, output, title=title)
    click.echo(f"wrote {output} ({width}x{height} pixels, {len(metrics)} epochs)")
