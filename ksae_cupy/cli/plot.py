"""``ksae-plot``: the paper's figures from trained runs (filters, hidden-activity histograms) and
a run's training curves."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy.cli.version import VersionedGroup, version_option
from ksae_cupy.cli.common import GivenPath, CONTEXT, DATA_DIR, QUIET, RUN_DIR, progress_printer, report_errors
from ksae_cupy.cli.run_options import SPLITS
from ksae_cupy.evaluation.plots import LAYOUTS
from ksae_cupy.session.outputs import OVERWRITE_HELP

# -o names a file the user chose: an existing one is replaced only with --overwrite (the default, the
# command's own file in the run folder, is replaced as a plot made again)
OVERWRITE = click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)


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
    from ksae_cupy.evaluation.run_figures import draw_filters

    layout_given = click.get_current_context().get_parameter_source("layout").name != "DEFAULT"
    click.echo(draw_filters(run_dir, output, n_filters, skip_dead, cols, shape, channels, layout, layout_given, scale,
                            data_dir, progress_printer(quiet), overwrite))


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
    from ksae_cupy.evaluation.run_figures import draw_firing

    click.echo(draw_firing(run_dir, output, data_dir, progress_printer(quiet), overwrite))


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
    from ksae_cupy.evaluation.run_figures import draw_hist

    click.echo(draw_hist(run_dirs, output, n_samples, split, alpha, bins, data_dir, progress_printer(quiet), overwrite))


@plot_command.command("curves", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("-o", "--output", type=GivenPath(path_type=Path), default=None,
              help="Image file; its suffix picks the format. [default: RUN_DIR/curves.png]")
@OVERWRITE
@report_errors
def plot_curves(run_dir, output, overwrite):
    """Training and validation loss and k, FVE and dead units over the epochs of a run (from its metrics.jsonl)."""
    from ksae_cupy.evaluation.run_figures import draw_curves

    click.echo(draw_curves(run_dir, output, overwrite))
