"""Figures: filter mosaics and activity histograms are PNGs of the expected size."""
import builtins

import numpy as np
import pytest

from ksae_cupy.evaluation import plots
from pngsize import png_size
from ksae_cupy.errors import KsaeError

mpimg = pytest.importorskip("matplotlib.image")


def test_mosaic_places_each_filter_as_its_image():
    W_dh = np.random.default_rng(0).standard_normal((6, 5))  # 5 filters of 2x3
    mosaic = plots.filter_mosaic(W_dh, image_shape=(2, 3), cols=3)
    assert mosaic.shape == (2 * 3 + 1, 3 * 4 + 1)  # 2 rows x 3 cols of 2x3 tiles, 1-pixel gaps
    f = W_dh[:, 4]
    expected = ((f - f.min()) / (f.max() - f.min())).reshape(2, 3)
    np.testing.assert_allclose(mosaic[4:6, 5:8], expected)  # filter 4: row 1, column 1
    assert (mosaic[:, 0] == 1).all() and (mosaic[3, :] == 1).all()


def test_colour_layouts_agree():
    rng = np.random.default_rng(1)
    img_nhwc = rng.random((4, 8, 8, 3))
    hwc = plots.filter_mosaic(img_nhwc.reshape(4, -1).T, channels=3, layout="hwc")
    chw = plots.filter_mosaic(img_nhwc.transpose(0, 3, 1, 2).reshape(4, -1).T, channels=3, layout="chw")
    assert hwc.shape == (19, 19, 3)
    np.testing.assert_allclose(hwc, chw)


def test_filter_grid_png_has_the_expected_pixel_size(tmp_path):
    W_dh = np.random.default_rng(2).standard_normal((784, 30))
    path = tmp_path / "filters.png"
    width, height = plots.save_filter_grid(W_dh, path, n_filters=25, scale=2)
    # 25 filters -> 5x5 grid of 28x28 tiles with 1-pixel gaps: 5*29+1 = 146, doubled.
    assert (width, height) == (292, 292) == png_size(path)
    assert mpimg.imread(path).shape[:2] == (292, 292)


def test_histogram_png_has_the_requested_size(tmp_path):
    rng = np.random.default_rng(3)
    sparse = np.where(rng.random((50, 100)) < 0.1, rng.random((50, 100)), 0)
    path = tmp_path / "hist.png"
    plots.save_activity_histograms({"k=10": sparse, "dense": rng.standard_normal((50, 100))}, path, size=(640, 400))
    assert png_size(path) == (640, 400)
    assert mpimg.imread(path).shape[:2] == (400, 640)


def test_non_square_filters_need_a_shape():
    with pytest.raises(KsaeError, match="not square") as refused:
        plots.filter_mosaic(np.ones((10, 3)))
    assert str(refused.value).endswith("give the image shape, e.g. image_shape 28x28")  # the Python parameter
    with pytest.raises(KsaeError, match="cannot be shown"):
        plots.filter_mosaic(np.ones((10, 3)), image_shape=(3, 3))


def test_the_command_names_its_shape_flag(tmp_path):
    from click.testing import CliRunner

    from clicheck import assert_one_line_error
    from ksae_cupy.cli.plot import plot_command
    from runfolder import make_run

    run = make_run(tmp_path / "run", np.ones((10, 3)), k=1)
    result = CliRunner().invoke(plot_command, ["filters", str(run), "-o", str(tmp_path / "f.png")])
    assert_one_line_error(result, "filters of 10 values are not square images with 1 channel(s); give the image "
                                  "shape, e.g. --shape 28x28", status=2)


def test_missing_matplotlib_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(KsaeError, match=r"pip install ksae-cupy\[plot\]"):
        plots.require_matplotlib()


def test_plot_curves_draws_loss_and_k_of_a_run_and_refuses_an_empty_one(tmp_path):
    import json

    from click.testing import CliRunner

    from clicheck import assert_one_line_error
    from ksae_cupy.cli.plot import plot_command

    run = tmp_path / "run"
    run.mkdir()
    records = [{"epoch": e, "step": 10 * e, "k": max(25, 100 - 25 * e), "lr": 0.01, "train_loss": 5.0 / e,
                "valid_loss": 4.0 / e, "dead_fraction": 0.1, "samples_per_s": 1.0, "seconds": 1.0} for e in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = CliRunner().invoke(plot_command, ["curves", str(run), "-o", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert "5 epochs" in result.output
    assert png_size(tmp_path / "c.png") == (900, 500)
    (run / "metrics.jsonl").write_text("")
    assert_one_line_error(CliRunner().invoke(plot_command, ["curves", str(run)]), "no epochs logged")


def test_curves_show_the_dead_units_over_the_epoch_and_over_the_window():
    records = [{"epoch": e, "k": 25, "train_loss": 1.0 / e, "valid_loss": None, "dead_fraction": 0.2 / e,
                "dead_window_fraction": 0.3 / e if e > 1 else None} for e in range(1, 5)]
    fig = plots.training_curves_figure(records)
    dead_ax = fig.axes[-1]
    assert dead_ax.get_ylabel() == "dead units (%)"
    lines = {line.get_label(): line for line in dead_ax.get_lines()}
    np.testing.assert_allclose(lines["dead over the epoch"].get_ydata(), [20, 10, 20 / 3, 5])
    window = lines["dead over the last dead_window examples"]  # epochs that logged it only
    np.testing.assert_allclose(window.get_xdata(), [2, 3, 4])
    np.testing.assert_allclose(window.get_ydata(), [15, 10, 7.5])
    # A run logged before the window metric: the epoch's curve alone.
    older = [{key: value for key, value in r.items() if key != "dead_window_fraction"} for r in records]
    assert [line.get_label() for line in plots.training_curves_figure(older).axes[-1].get_lines()] == [
        "dead over the epoch"]
