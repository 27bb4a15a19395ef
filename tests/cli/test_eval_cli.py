"""ksae-eval / ksae-plot / ksae-analyze through click: results, files, and one-line errors."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.evaluation import plots
from pngsize import png_size
from ksae_cupy.cli.analyze import analyze_command
from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.cli.plot import plot_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from clicheck import assert_one_line_error
from runfolder import make_run


@pytest.fixture(scope="module")
def synthetic_W():
    # The dictionary behind the built-in "synthetic" dataset (same generator, same seed).
    return make_sparse_signals(1)[2]


@pytest.fixture
def run_dir(tmp_path, synthetic_W):
    return make_run(tmp_path / "run-k5", synthetic_W, k=5, dataset="synthetic")


def invoke(command, args):
    return CliRunner().invoke(command, [str(a) for a in args])


def assert_user_error(result, *fragments):
    assert_one_line_error(result, *fragments, status=2)


def test_missing_run_folder(tmp_path):
    assert_user_error(invoke(eval_command, [tmp_path / "nope"]), "does not exist")


def test_folder_without_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_user_error(invoke(eval_command, [tmp_path / "empty"]), "checkpoint.h5")


def test_corrupt_checkpoint(run_dir):
    data = (run_dir / "checkpoint.h5").read_bytes()
    (run_dir / "checkpoint.h5").write_bytes(data[: len(data) // 3])
    assert_user_error(invoke(eval_command, [run_dir]))
    assert_user_error(invoke(plot_command, ["filters", run_dir]))
    assert_user_error(invoke(analyze_command, ["coherence", run_dir]))


@pytest.mark.parametrize("alphas,fragment", [("0.5", "alpha=0.5"), ("1,x", "--alphas"), ("30", "exceeds the 128 hidden")])
def test_bad_alphas(run_dir, alphas, fragment):
    assert_user_error(invoke(eval_command, [run_dir, "--alphas", alphas, "--device", "cpu"]), fragment)
    assert not (run_dir / "eval.json").exists()


def test_bad_l2_and_device(run_dir):
    assert_user_error(invoke(eval_command, [run_dir, "--l2", "-1"]), "l2")
    assert_user_error(invoke(eval_command, [run_dir, "--device", "tpu"]), "--device")
    assert_user_error(invoke(eval_command, [run_dir, "--l2-extend", "-1"]), "--l2-extend -1", "0 (the grid as given)")
    assert not (run_dir / "eval.json").exists()


def test_eval_writes_results_on_the_synthetic_run(run_dir):
    result = invoke(eval_command, [run_dir, "--alphas", "1,2", "--l2", "1e-3", "--max-iter", "40",
                                   "--device", "cpu", "--raw-baseline"])
    assert result.exit_code == 0, result.output
    saved = json.loads((run_dir / "eval.json").read_text())
    assert {t["alpha"] for t in saved["features"]["trials"]} == {1.0, 2.0}
    assert saved["features"]["selected"]["alpha"] in (1.0, 2.0)
    assert 0 <= saved["features"]["test_error"] < 0.75  # better than chance on 4 classes
    assert "raw pixels" in result.stdout and (run_dir / "eval.md").read_text() == result.stdout
    assert saved["l2_extend"] == 3  # the default; a one-value grid is the user's choice and is not extended
    assert {t["l2"] for t in saved["features"]["trials"]} == {1e-3}


def test_plot_filters_png(run_dir, tmp_path):
    out = tmp_path / "f.png"
    result = invoke(plot_command, ["filters", run_dir, "-o", out, "--n", "16", "--scale", "3"])
    assert result.exit_code == 0, result.output
    # 16 filters of 8x8 (D = 64) in a 4x4 grid with 1-pixel gaps: 4*9+1 = 37 pixels, times 3.
    assert png_size(out) == (111, 111)


def test_plot_filters_says_how_many_it_draws(run_dir, tmp_path):
    # Issue 55: `--n 100` reported "1000 filters", the run's count, not the figure's.
    result = invoke(plot_command, ["filters", run_dir, "-o", tmp_path / "f.png", "--n", "16"])
    assert result.exit_code == 0, result.output
    assert "k=5, 16 of 128 filters)" in result.output


def test_plot_filters_can_leave_the_dead_units_out(tmp_path, synthetic_W):
    # Units 0-39 are dead: a bias far below any input's product keeps them out of every top k.
    b_h = np.zeros(128)
    b_h[:40] = -1e3
    run = make_run(tmp_path / "half-dead", synthetic_W, k=5, dataset="synthetic", b_h=b_h)
    out = tmp_path / "live.png"
    result = invoke(plot_command, ["filters", run, "-o", out, "--n", "100", "--skip-dead", "--scale", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "88 of 128 filters; 40 dead left out: non-zero in no training example's k-code" in result.output
    # The 88 live filters of 8x8 in a 10-column grid, 9 rows, 1-pixel gaps: 10*9+1 x 9*9+1.
    assert png_size(out) == (91, 82)
    drawn = plots.filter_mosaic(synthetic_W[:, 40:], image_shape=(8, 8))
    from matplotlib import image as mpimg

    np.testing.assert_allclose(mpimg.imread(out)[:, :, 0], drawn, atol=0.01)  # the live ones, in order (8-bit grey)


def test_plot_filters_takes_colour_patch_layout_from_the_run_dataset(tmp_path):
    rng = np.random.default_rng(0)
    run = make_run(tmp_path / "patches-run", rng.standard_normal((192, 4)), k=2, dataset="patches")
    out = tmp_path / "p.png"
    result = invoke(plot_command, ["filters", run, "-o", out, "--scale", "1"])
    assert result.exit_code == 0, result.output
    # 4 colour filters of 8x8 (D = 192 = 8*8*3) in a 2x2 grid with 1-pixel gaps: 2*9+1 = 19.
    assert png_size(out) == (19, 19)


def test_plot_filters_rejects_a_wrong_shape(run_dir):
    assert_user_error(invoke(plot_command, ["filters", run_dir, "--shape", "28x28"]), "cannot be shown")
    assert_user_error(invoke(plot_command, ["filters", run_dir, "--shape", "big"]), "--shape")


def test_plot_hist_writes_into_the_run_folder_as_the_other_plots(run_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # before: activity-histogram.png in the current folder
    result = invoke(plot_command, ["hist", run_dir, "--n-samples", "50"])
    assert result.exit_code == 0, result.output
    assert (run_dir / "activity-histogram.png").is_file() and not (tmp_path / "activity-histogram.png").exists()
    assert f"wrote {run_dir / 'activity-histogram.png'}" in result.output


def test_plot_hist_compares_runs(run_dir, tmp_path, synthetic_W):
    dense = make_run(tmp_path / "dense", synthetic_W, k=128, dataset="synthetic")
    out = tmp_path / "h.png"
    result = invoke(plot_command, ["hist", run_dir, dense, "-o", out, "--n-samples", "200"])
    assert result.exit_code == 0, result.output
    assert png_size(out) == (800, 500)
    assert_user_error(invoke(plot_command, ["hist", run_dir, "--alpha", "0"]), "alpha")


def test_analyze_coherence_and_iti(run_dir):
    result = invoke(analyze_command, ["coherence", run_dir])
    assert result.exit_code == 0, result.output
    assert "0 zero-norm columns of 128" in result.output and "dead" not in result.output  # one meaning of dead
    W = make_sparse_signals(1)[2]
    Wn = W / np.linalg.norm(W, axis=0)
    mu = np.max(np.abs(Wn.T @ Wn) - np.eye(W.shape[1]))
    assert json.loads((run_dir / "coherence.json").read_text())["mu"] == pytest.approx(mu, rel=1e-5)

    result = invoke(analyze_command, ["iti", run_dir, "--n-samples", "100", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    report = json.loads((run_dir / "iti.json").read_text())
    # The run's W is the true dictionary of these 5-sparse signals: ITI finds every support.
    assert report["iti_converged_rate"] == 1.0 and report["relative_residual_iti"] < 1e-4
    assert_user_error(invoke(analyze_command, ["iti", run_dir, "--k", "0"]), "--k")


def test_analyze_theorem(tmp_path):
    out = tmp_path / "t.json"
    result = invoke(analyze_command, ["theorem", "--dim", "64", "--k", "3", "--n", "200", "-o", out])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["recovery_when_satisfied"] == 1.0
    assert_user_error(invoke(analyze_command, ["theorem", "--dim", "60"]), "power of two")
    assert_user_error(invoke(analyze_command, ["theorem", "--dictionary", tmp_path / "nope"]), "does not exist")


def test_analyze_theorem_takes_the_run_folder_as_the_command_table_shows(run_dir, tmp_path):
    # Issue 55: `ksae-analyze theorem RUN` failed; it wanted --dictionary RUN_DIR.
    by_position, by_option = tmp_path / "a.json", tmp_path / "b.json"
    result = invoke(analyze_command, ["theorem", run_dir, "--k", "2", "--n", "50", "-o", by_position])
    assert result.exit_code == 0, result.output
    assert invoke(analyze_command, ["theorem", "--dictionary", run_dir, "--k", "2", "--n", "50",
                                    "-o", by_option]).exit_code == 0
    assert json.loads(by_position.read_text()) == json.loads(by_option.read_text())
    assert json.loads(by_position.read_text())["H"] == 128  # the run's W, not the 512-atom default
    assert_user_error(invoke(analyze_command, ["theorem", run_dir, "--dictionary", "gaussian"]), "give one")


def test_compare_ksae_with_omp_and_dictionary_learning(run_dir):
    pytest.importorskip("sklearn")
    result = invoke(analyze_command, ["compare", run_dir, "--n-train", "300", "--l2", "1e-3", "--dict-seconds", "0.5"])
    assert result.exit_code == 0, result.output
    report = json.loads((run_dir / "compare.json").read_text())
    assert set(report["methods"]) == {"ksae", "omp", "dict_learning"} and report["n_train"] == 300
    # The run's W is the true dictionary: OMP with the true sparsity finds the codes, so it
    # classifies at least as well as chance and every timing is real.
    for m in report["methods"].values():
        assert 0 <= m["test_error"] < 0.75 and m["test_encode_seconds"] > 0
    assert_user_error(invoke(analyze_command, ["compare", run_dir, "--dict-seconds", "soon"]), "--dict-seconds")
