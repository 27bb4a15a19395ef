"""Every way in parses like ksae-train's command line (session/fields.py's parse_text over its declarations):
a pack's ``--run`` keys, ksae-sweep's grid; a key or a grid value given twice is refused; an option the mode
ignores is refused by name; run folders are compared resolved."""
import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy.cli.sweep import sweep_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.errors import KsaeError
from ksae_cupy.recipes.train_pack import main as train_pack, parse_run, run_config
from ksae_cupy.session.fields import TRAIN, parse_text

DECLARED = {option.name: option for option in TRAIN}


@pytest.mark.parametrize("key, text, value", [("lr", "0.01", 0.01), ("lr", "auto", "auto"), ("lr", "AUTO", "auto"),
                                              ("k", "25", 25), ("seed", "3", 3), ("epochs", "7", 7)])
def test_a_value_parses_as_the_option_does(key, text, value):
    assert parse_text(DECLARED[key], text) == value


@pytest.mark.parametrize("key, text, words", [("lr", "nan", "--lr nan is not allowed; use a positive learning rate"),
                                              ("lr", "-1", "--lr -1.0 is not allowed"),
                                              ("lr", "fast", "--lr 'fast' is not allowed; use a positive learning "
                                                              "rate or auto"),
                                              ("seed", "-1", "--seed -1 is not allowed; use an integer from 0"),
                                              ("epochs", "0", "--epochs 0 is not allowed; use a positive number"),
                                              ("k", "2.5", "--k '2.5' is not allowed; use a whole number")])
def test_a_bad_value_is_refused_in_the_options_words(key, text, words):
    with pytest.raises(KsaeError) as caught:
        parse_text(DECLARED[key], text)
    assert words in str(caught.value)


def test_ksae_train_refuses_the_seed_with_the_words_the_pack_uses(tmp_path):
    data = tmp_path / "d.npy"
    np.save(data, np.random.default_rng(0).random((40, 8), dtype=np.float32))
    result = CliRunner().invoke(train_command, [str(data), "--seed", "-1", "--hidden", "4", "--k", "2",
                                                "--run-dir", str(tmp_path / "r")])
    assert_one_line_error(result, "--seed -1 is not allowed; use an integer from 0 to", status=2)
    with pytest.raises(KsaeError, match="seed -1 is not allowed; use an integer from 0 to"):
        parse_run("dir=x,k=2,epochs=1,seed=-1")


@pytest.mark.parametrize("text, words", [("dir=x,k=5,k=6,epochs=1", "k is given twice"),
                                         ("dir=x,k=5,epochs=1,lr=nan", "lr nan is not allowed"),
                                         ("dir=x,k=5,epochs=1,seed=-1", "seed -1 is not allowed"),
                                         ("dir=x,k=5,epochs=1,lr=x", "lr 'x' is not allowed")])
def test_a_pack_run_is_refused_in_one_line(text, words):
    with pytest.raises(KsaeError, match=words):
        parse_run(text)


def test_a_pack_run_takes_lr_as_a_number_and_auto(tmp_path):
    """The found case: ``lr=0.01`` ended in a traceback (a float given where text was parsed), ``auto`` refused."""
    run = parse_run(f"dir={tmp_path / 'a'},k=5,epochs=3,lr=0.01")
    assert run_config("synthetic", run, hidden=20).lr == 0.01
    run = parse_run(f"dir={tmp_path / 'b'},k=5,epochs=3,lr=auto")
    assert run_config("synthetic", run, hidden=20).lr == "auto"


def test_a_pack_run_k_above_hidden_names_the_run(tmp_path):
    with pytest.raises(KsaeError, match=r"--run dir=.*: k 30 is not allowed; use 1 <= k <= hidden \(20\)"):
        run_config("synthetic", parse_run(f"dir={tmp_path / 'a'},k=30,epochs=3"), hidden=20)


def test_one_folder_through_a_symlink_is_refused_before_anything_is_written(tmp_path, capsys):
    data = tmp_path / "d.npy"
    np.save(data, np.random.default_rng(0).random((64, 8), dtype=np.float32))
    (tmp_path / "runs").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "runs")
    status = train_pack([str(data), "--hidden", "4", "--threads", "1", "--run", f"dir={tmp_path / 'runs'},k=2,epochs=1",
                         "--run", f"dir={tmp_path / 'alias'},k=2,epochs=1"])
    assert status == 2
    err = capsys.readouterr().err
    assert "is given to more than one run" in err and "given also as" in err
    assert list((tmp_path / "runs").iterdir()) == []  # no config.json left behind


@pytest.mark.parametrize("args, words", [(["--k", "5,5"], "--k '5,5' gives 5 twice"),
                                         (["--seeds", "-1"], "--seeds -1 is not allowed; use an integer from 0"),
                                         (["--lr", "nan"], "--lr nan is not allowed"),
                                         (["--epochs", "0"], "--epochs 0 is not allowed"),
                                         (["--alpha", "1,1"], "--alpha '1,1' gives 1 twice"),
                                         (["--alpha", "nan"], "alpha=nan is not allowed"),
                                         (["--pack", "--workers", "2"], "--workers 2 has no effect with --pack")])
def test_the_sweeps_grid_parses_as_ksae_train(tmp_path, args, words):
    result = CliRunner().invoke(sweep_command, ["synthetic", "--hidden", "16", "--out", str(tmp_path / "s"), "--k", "2", *args])
    assert_one_line_error(result, words, status=2)
    assert not (tmp_path / "s").exists()


def test_a_hidden_size_a_resumed_pack_run_would_ignore_is_refused(tmp_path):
    from runfolder import make_run

    run = make_run(tmp_path / "run", np.ones((16, 8), np.float32), k=2)
    assert run_config("synthetic", {"dir": str(run)}, hidden=None).hidden == 8
    assert run_config("synthetic", {"dir": str(run)}, hidden=8).hidden == 8
    with pytest.raises(KsaeError, match="--hidden 20 has no effect on .* 8 hidden units"):
        run_config("synthetic", {"dir": str(run)}, hidden=20)
