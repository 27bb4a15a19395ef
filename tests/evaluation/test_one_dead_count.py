"""One dead count per run: the end of ksae-train (units.json and its done line), ksae-eval's train row,
ksae-plot filters --skip-dead, ksae-plot firing and the export give the same number; ksae-plot firing draws the
firing-frequency histogram and ksae-plot curves draws FVE."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.cli.plot import plot_command
from ksae_cupy.cli.train import train_command

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "run"
    result = CliRunner().invoke(train_command, ["synthetic", "--hidden", "64", "--k", "3", "--epochs", "2",
                                                "--device", "cpu", "--threads", "1", "--run-dir", str(run)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return run, result.output


def test_every_place_gives_the_runs_one_dead_count(run_dir):
    run, output = run_dir
    units = json.loads((run / "units.json").read_text())
    n_dead = units["n_dead"]
    assert n_dead > 0 and f"(dead {n_dead} of 64, " in output.splitlines()[-1]
    filters = CliRunner().invoke(plot_command, ["filters", str(run), "--skip-dead", "-o", str(run / "f.png")])
    assert filters.exit_code == 0 and f"; {n_dead} dead left out" in filters.output, filters.output
    firing = CliRunner().invoke(plot_command, ["firing", str(run)])
    assert firing.exit_code == 0 and f", {n_dead} dead: " in firing.output, firing.output
    assert (run / "firing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.evaluation.trained_run import open_run
    from ksae_cupy.evaluation.run_evaluation import reconstruction_splits

    data = load_dataset("synthetic")
    opened = open_run(run)
    splits = reconstruction_splits(opened.params, data, 3, 1.0, "sort", "linear", __import__("ksae_cupy").backend.CPU)
    assert splits["train"]["n_dead"] == n_dead  # ksae-eval's train row
    (run / "units.json").unlink()  # without the record, ksae-plot measures the same from the dataset
    again = CliRunner().invoke(plot_command, ["filters", str(run), "--skip-dead", "-o", str(run / "g.png")])
    assert f"; {n_dead} dead left out" in again.output


def test_the_firing_histogram_is_log10_density_of_the_live_units(tmp_path):
    from ksae_cupy.evaluation import plots

    drawn = {}
    real_figure = plots.save_firing_histogram

    counts = np.array([0, 0, 1, 10, 100, 1000])
    width, height = real_figure(counts, 1000, tmp_path / "h.png")
    assert (width, height) == (800, 500) and (tmp_path / "h.png").is_file()
    import matplotlib.axes

    original = matplotlib.axes.Axes.hist

    def spy(self, x, *args, **kwargs):
        drawn["x"], drawn["density"] = np.asarray(x), kwargs.get("density")
        return original(self, x, *args, **kwargs)

    matplotlib.axes.Axes.hist = spy
    try:
        real_figure(counts, 1000, tmp_path / "i.png")
    finally:
        matplotlib.axes.Axes.hist = original
    np.testing.assert_allclose(drawn["x"], [-3, -2, -1, 0])
    assert drawn["density"] is True


def test_curves_draw_fve(run_dir):
    from ksae_cupy.evaluation.plots import training_curves_figure
    from ksae_cupy.session.runs import RunFolder

    run, _ = run_dir
    metrics = RunFolder(run).read_metrics()
    fig = training_curves_figure(metrics)
    fve_axes = [ax for ax in fig.axes if ax.get_ylabel() == "FVE"]
    assert len(fve_axes) == 1
    labels = [line.get_label() for line in fve_axes[0].get_lines()]
    assert labels == ["training FVE", "validation FVE"]
    np.testing.assert_allclose(fve_axes[0].get_lines()[0].get_ydata(), [m["fve"] for m in metrics])
