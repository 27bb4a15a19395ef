"""Values the parser accepts but that mean nothing are refused before any work, in one line naming
the value and what is allowed: empty paths, rates and widths that vanish in the model's dtype, a
learning rate too small to move any weight of this data, a rising fine-tuning schedule (unless
asked for), options that do not apply, and ranges past what a figure or a count can use."""
import re

import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy import model
from ksae_cupy.cli.analyze import analyze_command
from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.cli.finetune import finetune_command
from ksae_cupy.cli.plot import plot_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.errors import KsaeError
from ksae_cupy.training.estimator import KSparseAutoencoder

QUICK = ["synthetic", "--hidden", "16", "--k", "2", "--no-k-schedule", "--batch-size", "500", "--device", "cpu",
         "--epochs", "1"]
FT = ["--epochs", "1", "--batch-size", "500", "--device", "cpu"]


def invoke(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "run"
    assert invoke(train_command, *QUICK, "--run-dir", path).exit_code == 0
    return path


# -- empty paths -----------------------------------------------------------------------------------

@pytest.mark.parametrize("command, args, flag", [
    (train_command, [*QUICK, "--run-dir", ""], "--run-dir ''"),
    (train_command, [*QUICK, "--data-dir", " "], "--data-dir ' '"),
    (train_command, ["--resume", ""], "--resume ''"),
    (train_command, ["", "--epochs", "1"], "DATASET ''"),
    (train_command, [*QUICK, "--labels", ""], "--labels ''"),
    (eval_command, [""], "RUN_DIR ''"),
    (finetune_command, ["", *FT], "PRETRAINED ''"),
])
def test_an_empty_path_is_refused_and_nothing_is_written_in_the_current_folder(command, args, flag, tmp_path,
                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(CliRunner().invoke(command, args), flag, "an empty path", status=2)
    assert list(tmp_path.iterdir()) == []


# -- values that vanish in the model's dtype -------------------------------------------------------

def test_a_rate_too_small_to_move_any_weight_is_refused_naming_the_smallest_that_does():
    X = make_sparse_signals(300, D=8, H=16, k=2, seed=0)[0]
    settings = dict(n_hidden=16, k=2, k_start=None, epochs=1, batch_size=300, device="cpu", sigma=0.01)
    with pytest.raises(KsaeError, match=r"lr 1e-300 is not allowed for this data: in float32") as refused:
        KSparseAutoencoder(lr=1e-300, **settings).fit(X)
    smallest = float(re.search(r"smallest rate that moves a weight here is about (\S+)$", str(refused.value))[1])
    with pytest.raises(KsaeError, match=f"about {smallest:g}"):
        KSparseAutoencoder(lr=smallest / 3, **settings).fit(X)
    # At the rate named, one full-batch step moves at least one weight; below it, none would.
    W_init = model.init_params(8, 16, 0.01, np.random.default_rng(0), np.float32)["W_dh"]
    W_after = KSparseAutoencoder(lr=smallest, **settings).fit(X).components_.T
    assert (W_after != W_init).any()


def test_the_command_names_the_smallest_rate_too_before_making_the_run_folder(tmp_path):
    result = invoke(train_command, *QUICK, "--run-dir", tmp_path / "r", "--lr", "1e-20")
    assert_one_line_error(result, "--lr 1e-20 is not allowed for this data", "the smallest rate that moves a weight",
                          status=2)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("option, value, fragment", [
    ("--sigma", "1e-50", "below its smallest normal number"),
    ("--momentum", "0.99999999999", "it rounds to 1 there"),
])
def test_sigma_and_momentum_that_round_away_in_float32_are_refused(tmp_path, option, value, fragment):
    assert_one_line_error(invoke(train_command, *QUICK, "--run-dir", tmp_path / "r", option, value),
                          f"{option} {value} is not allowed in float32", fragment, status=2)
    assert not (tmp_path / "r").exists()


def test_a_sigma_whose_square_overflows_is_refused_and_a_large_one_is_blamed_not_the_rate(tmp_path):
    assert_one_line_error(invoke(train_command, *QUICK, "--run-dir", tmp_path / "a", "--sigma", "1e30"),
                          "--sigma 1e+30 is not allowed in float32: its square overflows", status=2)
    result = invoke(train_command, *QUICK, "--run-dir", tmp_path / "b", "--sigma", "1e10")
    assert_one_line_error(result, "at epoch 1, step 1", "the initial model's loss on the first batch",
                          "use a smaller --sigma (now 10000000000.0)", status=1)
    assert "smaller rate" not in result.stderr


@pytest.mark.parametrize("option, value", [("--lr-end", "1e-300"), ("--sigma", "1e-50"), ("--sigma", "1e30"),
                                           ("--momentum", "0.99999999999")])
def test_finetune_values_that_round_away_in_float32_are_refused(run, tmp_path, option, value):
    args = [run, *FT, "--run-dir", tmp_path / "ft", option, value]
    assert_one_line_error(invoke(finetune_command, *args), f"{option} {float(value)} is not allowed in float32",
                          status=2)


# -- a rising schedule, options that do not apply ----------------------------------------------------

def test_a_rising_finetune_schedule_needs_rising_lr(run, tmp_path):
    args = [run, *FT, "--lr-start", "0.001", "--lr-end", "0.01"]
    assert_one_line_error(invoke(finetune_command, *args, "--run-dir", tmp_path / "a"),
                          "--lr-end 0.01 is above --lr-start 0.001", "--rising-lr", status=2)
    assert not (tmp_path / "a").exists()
    result = invoke(finetune_command, *args, "--run-dir", tmp_path / "b", "--rising-lr")
    assert result.exit_code == 0, result.output
    softmax = [run, *FT, "--phases", "softmax,all", "--lr-end", "0.01", "--softmax-lr-start", "0.005"]
    assert_one_line_error(invoke(finetune_command, *softmax, "--run-dir", tmp_path / "c"),
                          "--lr-end 0.01 is above --softmax-lr-start 0.005", "--rising-lr", status=2)
    assert not (tmp_path / "c").exists()


def test_options_that_do_not_apply_are_named(run, tmp_path):
    assert_one_line_error(invoke(finetune_command, run, *FT, "--k", "0", "--run-dir", tmp_path / "a"),
                          "--k only applies with --no-pretraining or --baseline", status=2)
    assert_one_line_error(invoke(train_command, *QUICK, "--k-start", "4", "--run-dir", tmp_path / "b"),
                          "--k-start 4 contradicts --no-k-schedule", status=2)


# -- ranges past what a count or a figure can use ----------------------------------------------------

@pytest.mark.parametrize("command, args, fragments", [
    (eval_command, ["--alphas", "1e308"], ["alpha*k", "exceeds the 16 hidden units"]),
    (eval_command, ["--alphas", "inf"], ["alpha=inf", "finite alpha >= 1"]),
    (eval_command, ["--l2", "inf"], ["l2=inf", "finite l2 >= 0"]),
    (finetune_command, ["--alpha", "1e308"], ["alpha*k", "exceeds the 16 hidden units"]),
])
def test_infinite_and_overflowing_alphas_and_l2_are_one_line(run, tmp_path, command, args, fragments):
    extra = [*FT, "--run-dir", tmp_path / "ft"] if command is finetune_command else ["--device", "cpu"]
    assert_one_line_error(invoke(command, run, *args, *extra), *fragments, status=2)


@pytest.mark.parametrize("args, fragments", [
    (["filters", "{run}", "--cols", "0"], ["cols=0 is not allowed"]),
    (["filters", "{run}", "--scale", "100000"], ["scale=100000 is not allowed here", "use a scale of at most"]),
    (["hist", "{run}", "--bins", "1000000000"], ["--bins 1000000000 is not allowed; use 1 to 800"]),
])
def test_figures_past_their_meaningful_size_are_refused(run, args, fragments):
    pytest.importorskip("matplotlib")
    result = invoke(plot_command, *[str(run) if a == "{run}" else a for a in args])
    assert_one_line_error(result, *fragments, status=2)


def test_a_negative_seed_is_one_line_in_analyze():
    assert_one_line_error(invoke(analyze_command, "theorem", "--seed", "-1"), "--seed -1 is not allowed", status=2)


@pytest.mark.parametrize("args, fragments", [
    (["--run-dir", ""], ["--run-dir '' is not allowed: an empty path"]),
    (["--lr", "1e-300"], ["lr 1e-300 is not allowed in float32"]),
    (["--sigma", "1e-50"], ["sigma 1e-50 is not allowed in float32"]),
    (["--momentum", "0.99999999999"], ["it rounds to 1 there"]),
    (["--weight-decay", "1e308"], ["lr * weight_decay", ">= 1 would shrink every weight past zero"]),
])
def test_ksae_baseline_refuses_the_same_meaningless_values(tmp_path, monkeypatch, args, fragments):
    from ksae_cupy.cli.baseline import baseline_command

    monkeypatch.chdir(tmp_path)
    result = invoke(baseline_command, "synthetic", "--model", "dropout-ae", "--hidden", "16", "--epochs", "1",
                    "--device", "cpu", *(["--run-dir", tmp_path / "r"] if args[0] != "--run-dir" else []), *args)
    assert_one_line_error(result, *fragments, status=2)
    assert list(tmp_path.iterdir()) == []
