"""``ksae-plot``'s figures of trained runs, each made whole: the run opened, what the figure reads measured (the
units' firing counts, the hidden activities of a split), the image written, and the line that says so."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.evaluation.plots import (check_image_output, check_training_records, filters_drawn, parse_image_shape,
                                        require_matplotlib, save_activity_histograms, save_filter_grid,
                                        save_firing_histogram, save_training_curves)
from ksae_cupy.evaluation.trained_run import dataset_split, load_run_dataset, open_run

HIST_WIDTH = 800  # pixels: save_activity_histograms' default size


def _checked_output(output, default: Path, runs, overwrite: bool) -> Path:
    """The image to write (-o, else ``default``, the command's own file in the first run folder), checked before
    any work: a file the user named is replaced only with --overwrite, the command's own as a plot made again."""
    check_image_output(output or default, runs=runs, overwrite=overwrite or output is None)
    return output or default


def draw_filters(run_dir, output, n_filters, skip_dead, cols, shape, channels, layout, layout_given, scale, data_dir,
                 say, overwrite) -> str:
    """Each column of W as an image, in a grid; ``layout_given``: --layout was on the command line."""
    require_matplotlib()
    run = open_run(run_dir)
    output = _checked_output(output, run.path / "filters.png", [run_dir], overwrite)
    image_shape, channels = parse_image_shape(shape), None if channels is None else int(channels)
    if image_shape is None and channels is None:  # draw the run's dataset as it is laid out
        from ksae_cupy.datasets.registry import DATASETS

        known = DATASETS[run.dataset].image_shape if run.dataset in DATASETS else None
        if known is not None and known[0] * known[1] * (known[2] if len(known) == 3 else 1) == run.params["W_dh"].shape[0]:
            image_shape, channels = known[:2], (known[2] if len(known) == 3 else 1)
    if (channels or 1) == 1 and layout_given:
        raise KsaeError(f"--layout {layout} has no effect on grey filters (one channel); it orders a colour "
                        f"filter's values: give --channels 3, or leave --layout out")
    W_dh, left_out = run.params["W_dh"], ""
    if skip_dead:
        W_dh, left_out = _live_filters(run, data_dir, say)
    drawn = filters_drawn(W_dh.shape[1], n_filters)
    width, height = save_filter_grid(W_dh, output, image_shape, channels or 1, layout, n_filters, cols, scale)
    return f"wrote {output} ({width}x{height} pixels, k={run.k}, {drawn} of {run.H} filters{left_out})"


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
    X_nd = load_run_dataset(run, data_dir, say).X_train
    params = run.params
    counts_h = firing_counts(params, X_nd.astype(params["W_dh"].dtype), run.k,
                             run.ckpt.config.get("activation", "linear"))
    return counts_h, int(X_nd.shape[0])


def draw_firing(run_dir, output, data_dir, say, overwrite) -> str:
    """The histogram of log10 firing frequency per unit, dead units counted in the legend."""
    require_matplotlib()
    output = _checked_output(output, Path(run_dir) / "firing.png", [run_dir], overwrite)
    run = open_run(run_dir)
    counts_h, rows = run_firing_counts(run, data_dir, say)
    n_dead = int((counts_h == 0).sum())
    width, height = save_firing_histogram(counts_h, rows, output,
                                          title=f"{run.path.name}: k {run.k}, {run.H} units, {n_dead} dead")
    return (f"wrote {output} ({width}x{height} pixels, {run.H} units, {n_dead} dead: non-zero in no training "
            f"example's k-code)")


def draw_hist(run_dirs, output, n_samples, split, alpha, bins, data_dir, say, overwrite) -> str:
    """The histogram of hidden activities of one or more runs on the first ``n_samples`` rows of ``split``."""
    from ksae_cupy.model import encode

    require_matplotlib()
    output = _checked_output(output, Path(run_dirs[0]) / "activity-histogram.png", run_dirs, overwrite)
    if n_samples < 1 or bins < 1:
        raise KsaeError("--n-samples and --bins must be positive")
    if bins > HIST_WIDTH:  # more bins than pixels draws nothing more (and 10^9 of them fill the memory)
        raise KsaeError(f"--bins {bins} is not allowed; use 1 to {HIST_WIDTH} (the plot is {HIST_WIDTH} pixels wide)")
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
    return f"wrote {output}"


def draw_curves(run_dir, output, overwrite) -> str:
    """Training and validation loss and k, FVE and dead units over the epochs of a run's metrics.jsonl."""
    from ksae_cupy.session.runs import RunFolder

    require_matplotlib()
    if Path(run_dir).is_file():  # before its default output, run_dir/curves.png, is named as unwritable
        raise KsaeError(f"{run_dir} is a file, not a run folder; give the folder that holds metrics.jsonl")
    output = _checked_output(output, Path(run_dir) / "curves.png", [run_dir], overwrite)
    metrics = RunFolder(run_dir).read_metrics()
    check_training_records(metrics, Path(run_dir) / "metrics.jsonl")
    last = metrics[-1] if metrics else None
    title = (f"{Path(run_dir).name}: {last['epoch']} epochs, k {metrics[0]['k']} -> {last['k']}, "
             f"valid loss {last['valid_loss']:.4f}" if last and last.get("valid_loss") is not None else "")
    width, height = save_training_curves(metrics, output, title=title)
    return f"wrote {output} ({width}x{height} pixels, {len(metrics)} epochs)"
