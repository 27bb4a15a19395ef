"""Many runs in one launch (ksae_cupy/training/packed.py, packed_runs.py): a run packed with others gives
the numbers of the same run alone, bit for bit on the CPU, in its own run folder that a ksae-train
--resume continues alone; a pack stopped mid-way and started again ends as one never stopped."""
from __future__ import annotations

from dataclasses import replace
import json
import os
import signal

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.backend import CPU
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets import Dataset
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.errors import KsaeError
from ksae_cupy.training.checkpoint import load_checkpoint
from ksae_cupy.training.packed import Pack
from ksae_cupy.session.packed_runs import PackStopped, train_packed
from ksae_cupy.training.trainer import TrainConfig, Trainer
from ksae_cupy.datasets.registry import DATASETS

TIMING = ("seconds", "samples_per_s", "parts", "time")  # what differs between any two runs of one seed


@pytest.fixture
def data(monkeypatch):
    """The built-in "synthetic" dataset cut to 1,200 / 300 signals of D = 32 (the same generator), for
    ksae-train alone and the packs alike."""
    X, _, _ = make_sparse_signals(1500, D=32, H=64, k=4, seed=5)
    small = Dataset(name="synthetic", X_train=X[:1200].astype(np.float32), X_valid=X[1200:].astype(np.float32))
    monkeypatch.setitem(DATASETS, "synthetic", replace(DATASETS["synthetic"], load=lambda root, log=print: small))
    return small


# Three runs differing in seed, k, learning rate, epochs, batch size and k schedule (one starts at k 20).
CONFIGS = [dict(hidden=40, k=4, epochs=3, batch_size=100, lr=0.01, seed=1, k_start=None),
           dict(hidden=40, k=7, epochs=4, batch_size=80, lr=0.004, seed=2, k_start=20),
           dict(hidden=40, k=4, epochs=2, batch_size=100, lr=0.02, seed=3, k_start=None)]


def configs():
    return [TrainConfig(**options) for options in CONFIGS]


def train_alone(data, options: dict, run_dir, threads: int = 1):
    """The run as ``ksae-train`` trains it alone, on ``threads`` threads."""
    args = ["synthetic", "--hidden", options["hidden"], "--k", options["k"],
            "--epochs", options["epochs"], "--batch-size", options["batch_size"], "--lr", options["lr"],
            "--seed", options["seed"], "--threads", threads, "--device", "cpu", "--quiet", "--run-dir", run_dir]
    args += ["--no-k-schedule"] if options["k_start"] is None else ["--k-start", options["k_start"]]
    result = CliRunner().invoke(train_command, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def metrics(run_dir) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{key: value for key, value in line.items() if key not in TIMING} for line in lines]


def assert_same_run(a_dir, b_dir) -> None:
    """Checkpoints equal array for array (parameters, velocities, dead-unit counts, generator state,
    position) and metrics lines equal but for their timings."""
    a, b = load_checkpoint(a_dir / "checkpoint.h5"), load_checkpoint(b_dir / "checkpoint.h5")
    assert (a.epoch, a.step, a.batch_in_epoch) == (b.epoch, b.step, b.batch_in_epoch)
    for part in ("params", "velocities", "units"):
        for name, value in getattr(a, part).items():
            np.testing.assert_array_equal(getattr(b, part)[name], value, err_msg=f"{part} {name}")
    assert a.rng_state == b.rng_state
    assert metrics(a_dir) == metrics(b_dir)


@pytest.mark.parametrize("threads", [1, 2])  # 2: the CPU kernels' step in two lanes, BLAS on one thread meanwhile
def test_a_run_packed_with_others_gives_the_numbers_of_the_run_alone(data, tmp_path, threads):
    folders = [tmp_path / "pack" / f"run{i}" for i in range(3)]
    outcomes = train_packed(configs(), data, CPU, folders, settings={"threads": threads}, log=lambda line: None)
    assert [o.report.epoch for o in outcomes] == [3, 4, 2] and not any(o.diverged for o in outcomes)
    for i, options in enumerate(CONFIGS):
        train_alone(data, options, tmp_path / f"alone{i}", threads)
        assert_same_run(folders[i], tmp_path / f"alone{i}")
    # The k schedule ran in the packed run as alone: k 20 first, then down to 7.
    assert [line["k"] for line in metrics(folders[1])][0] == 20 and metrics(folders[1])[-1]["k"] == 7


def test_a_packed_run_goes_on_alone_with_ksae_train_resume(data, tmp_path):
    """A pack's run folder is an ordinary run: ksae-train --resume takes it further, as it would its own."""
    options = {**CONFIGS[0], "epochs": 2}
    train_packed([TrainConfig(**options), configs()[1]], data, CPU, [tmp_path / "packed", tmp_path / "other"],
                 settings={"threads": 1}, log=lambda line: None)
    train_alone(data, options, tmp_path / "alone")
    for run_dir in (tmp_path / "packed", tmp_path / "alone"):
        result = CliRunner().invoke(train_command, ["--resume", str(run_dir), "--epochs", "3", "--quiet"],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
    assert_same_run(tmp_path / "packed", tmp_path / "alone")


def test_a_pack_stopped_mid_way_and_started_again_ends_as_one_never_stopped(data, tmp_path):
    """A Ctrl-C after the first epoch line: every run saves (two of them mid-epoch) and the call raises
    PackStopped; the same call again ends bit for bit as a pack that ran straight through."""
    stopped = [tmp_path / "stopped" / f"run{i}" for i in range(3)]
    straight = [tmp_path / "straight" / f"run{i}" for i in range(3)]
    train_packed(configs(), data, CPU, straight, settings={"threads": 1}, log=lambda line: None)

    def ctrl_c_once(line):
        if "epoch 1/" in line and not ctrl_c_once.sent:
            ctrl_c_once.sent = True
            os.kill(os.getpid(), signal.SIGINT)

    ctrl_c_once.sent = False
    with pytest.raises(PackStopped) as stop:
        train_packed(configs(), data, CPU, stopped, settings={"threads": 1}, log=ctrl_c_once)
    assert stop.value.status == 130 and len(stop.value.unfinished) == 3
    positions = [load_checkpoint(folder / "checkpoint.h5") for folder in stopped]
    assert any(ckpt.batch_in_epoch for ckpt in positions)  # saved mid-epoch: the resume starts there
    train_packed(configs(), data, CPU, stopped, settings={"threads": 1}, log=lambda line: None)
    for a, b in zip(stopped, straight):
        assert_same_run(a, b)


def test_the_stacked_step_equals_the_runs_alone_within_float32_rounding(data):
    """The GPU's way (one stacked model; here on NumPy): each run within float32 rounding of the run alone,
    its kept units, dead units and schedule the same."""
    X, X_valid = data.X_train, data.X_valid
    alone, reports_alone = [], []
    for config in configs():
        trainer, reports = Trainer(config, CPU, D=32), []
        trainer.fit(X, X_valid, on_epoch=reports.append)
        alone.append(trainer)
        reports_alone.append(reports)
    members = [Trainer(config, CPU, D=32) for config in configs()]
    reports_packed = [[] for _ in members]
    pack = Pack(members, stacked=True)
    pack.fit(X, X_valid, on_epoch=lambda i, report: reports_packed[i].append(report))
    for lone, packed, lone_reports, packed_reports in zip(alone, members, reports_alone, reports_packed):
        assert (packed.epoch, packed.step) == (lone.epoch, lone.step)
        for name, value in lone.params.items():
            scale = float(np.abs(value).max())
            np.testing.assert_allclose(packed.params[name], value, rtol=0, atol=1e-5 * scale, err_msg=name)
        assert [r.k for r in packed_reports] == [r.k for r in lone_reports]
        for p, q in zip(packed_reports, lone_reports):
            assert p.train_loss == pytest.approx(q.train_loss, rel=1e-5)
            assert p.valid_loss == pytest.approx(q.valid_loss, rel=1e-5)
            assert p.dead_fraction == q.dead_fraction
    # The members train on views of the stacked arrays: a checkpoint holds each run's own slice.
    assert pack.params_m["W_dh"].shape == (3, 32, 40)
    np.testing.assert_array_equal(members[1].checkpoint().params["W_dh"], pack.params_m["W_dh"][1])


@pytest.mark.parametrize("stacked, said", [(False, "the loss became inf at epoch 1, step 10"),
                                           (True, "the training loss summed over the epoch became")])
def test_a_run_that_diverges_stops_alone(data, tmp_path, stacked, said):
    """One by one the run stops at the step, as alone; stacked, when the epoch ends (no value comes back per step)."""
    bad = TrainConfig(**{**CONFIGS[0], "lr": 3.0})  # below the rate check before training; diverges at step 10
    outcomes = train_packed([bad, configs()[2]], data, CPU, [tmp_path / "bad", tmp_path / "good"],
                            settings={"threads": 1}, stacked=stacked, log=lambda line: None)
    assert said in outcomes[0].diverged and "--lr" in outcomes[0].diverged
    assert outcomes[1].diverged is None and outcomes[1].report.epoch == 2
    assert not (tmp_path / "bad" / "checkpoint.h5").exists()  # no good checkpoint was ever written


def test_refusals_name_the_bad_value(data, tmp_path):
    with pytest.raises(KsaeError, match="given to more than one run"):
        train_packed(configs()[:2], data, CPU, [tmp_path / "a", tmp_path / "a"], log=lambda line: None)
    train_packed(configs()[:1], data, CPU, [tmp_path / "b"], settings={"threads": 1}, log=lambda line: None)
    with pytest.raises(KsaeError, match=r"holds another run: k 4 \(asked: 7\)"):
        train_packed([TrainConfig(**{**CONFIGS[0], "k": 7})], data, CPU, [tmp_path / "b"], log=lambda line: None)
    with pytest.raises(KsaeError, match="must share the input width, hidden"):
        Pack([Trainer(TrainConfig(**{**CONFIGS[0], "hidden": h}), CPU, D=32) for h in (40, 50)], stacked=True)


def test_a_pack_given_again_finds_its_runs_though_their_k_schedule_was_dropped(data, tmp_path):
    """A one-epoch run whose k schedule never reaches k is made without it (k_start None, as ksae-train makes
    it); the same pack again is the same runs (done: nothing trained), and so is it with more epochs (trained
    on), and that again. Another k or seed in the same folder is still another run, refused in one line."""
    options = dict(hidden=40, k=4, batch_size=100, lr=0.01, seed=1, k_start=40)  # k-start auto at hidden 40
    folders = [tmp_path / "a", tmp_path / "b"]

    def asked(epochs):
        return [TrainConfig(**options, epochs=epochs), TrainConfig(**{**options, "k": 5, "seed": 2}, epochs=epochs)]

    first = train_packed(asked(1), data, CPU, folders, settings={"threads": 1}, log=lambda line: None)
    assert [o.job.trainer().config.k_start for o in first] == [None, None]
    again = train_packed(asked(1), data, CPU, folders, settings={"threads": 1}, log=lambda line: None)
    assert [o.report for o in again] == [None, None]  # nothing left to train
    assert [(o.job.trainer().epoch, o.job.trainer().step) for o in again] == [(1, 12), (1, 12)]
    for changed, said in (({"k": 6}, "k 4 (asked: 6)"), ({"seed": 9}, "seed 1 (asked: 9)")):
        with pytest.raises(KsaeError) as refused:
            train_packed([TrainConfig(**{**options, **changed}, epochs=1)], data, CPU, folders[:1],
                         settings={"threads": 1}, log=lambda line: None)
        assert str(refused.value) == (f"run folder {folders[0]} holds another run: {said}; give the run another "
                                      f"folder, or remove that one")
    longer = train_packed(asked(2), data, CPU, folders, settings={"threads": 1}, log=lambda line: None)
    assert [o.report.epoch for o in longer] == [2, 2]
    assert [o.job.trainer().config.k_start for o in longer] == [None, None]
    again = train_packed(asked(2), data, CPU, folders, settings={"threads": 1}, log=lambda line: None)
    assert [o.report for o in again] == [None, None]
    assert [(o.job.trainer().epoch, o.job.trainer().step) for o in again] == [(2, 24), (2, 24)]


def test_a_pack_leaves_the_callers_configurations_as_given(data, tmp_path):
    """A pack trains copies: a new run that drops its k schedule (one epoch never reaches k) and resolves --lr auto
    does so in its own configuration; the caller's are as given, and the same list given again is the same runs."""
    given = [TrainConfig(hidden=40, k=4, epochs=1, batch_size=100, lr="auto", seed=1, k_start=40),
             TrainConfig(hidden=40, k=5, epochs=1, batch_size=100, lr=0.01, seed=2, k_start=None)]
    before = [config.to_dict() for config in given]
    folders = [tmp_path / "a", tmp_path / "b"]
    first = train_packed(given, data, CPU, folders, settings={"threads": 1}, log=lambda line: None)
    trained = first[0].job.trainer().config
    assert (trained.k_start, trained.k_schedule_epochs, trained.lr_auto) == (None, 1, True)  # the run's own
    assert [config.to_dict() for config in given] == before
    assert (given[0].k_start, given[0].k_schedule_epochs, given[0].lr) == (40, None, "auto")
    again = train_packed(given, data, CPU, folders, settings={"threads": 1}, log=lambda line: None)
    assert [o.report for o in again] == [None, None]  # nothing left to train
    assert [config.to_dict() for config in given] == before

def test_a_stacked_pack_stopped_mid_epoch_and_resumed_from_checkpoints_ends_as_one_never_stopped(data):
    """The GPU's way (here on NumPy, deterministic): stopped after the first epoch of the runs of 12 batches
    (the run of 15 batches mid-epoch), each run rebuilt from its checkpoint alone and stacked again: every
    array and epoch report as in a pack that ran straight through."""
    X, X_valid = data.X_train, data.X_valid
    # 200 units and k 3: a unit kept in the 12 batches before the stop may be kept in none of the 3 after it,
    # so an epoch's dead fraction tells whether its count before the stop came back with the checkpoint.
    options = [{**c, "hidden": 200, "k": 3, "k_start": None} for c in CONFIGS]

    def configs():
        return [TrainConfig(**o) for o in options]

    def strip(report):
        return {key: value for key, value in vars(report).items() if key not in TIMING}

    straight, straight_reports = [Trainer(config, CPU, D=32) for config in configs()], [[], [], []]
    Pack(straight, stacked=True).fit(X, X_valid, on_epoch=lambda i, r: straight_reports[i].append(strip(r)))

    first, reports = [Trainer(config, CPU, D=32) for config in configs()], [[], [], []]
    pack = Pack(first, stacked=True)

    def stop_after_the_first_epoch(i, report):
        reports[i].append(strip(report))
        pack.stop_requested = True

    pack.fit(X, X_valid, on_epoch=stop_after_the_first_epoch)
    checkpoints = [trainer.checkpoint() for trainer in first]
    assert [c.batch_in_epoch for c in checkpoints] == [0, 12, 0] and [c.epoch for c in checkpoints] == [1, 0, 1]
    resumed = [Trainer(TrainConfig.from_dict(c.config), CPU, D=32, checkpoint=c) for c in checkpoints]
    Pack(resumed, stacked=True).fit(X, X_valid, on_epoch=lambda i, r: reports[i].append(strip(r)))
    for a, b in zip(resumed, straight):
        ca, cb = a.checkpoint(), b.checkpoint()
        for part in ("params", "velocities", "units"):
            for name, value in getattr(cb, part).items():
                np.testing.assert_array_equal(getattr(ca, part)[name], value, err_msg=f"{part} {name}")
    assert reports == straight_reports


def test_a_packed_run_is_built_by_ksae_trains_own_functions(data, tmp_path, monkeypatch):
    """Every run of a pack is made by the functions that make ksae-train's (session/train_run.py): a new one by
    new_job, a resumed one by resumed_trainer. With --lr auto, --center-input and a k schedule too short to
    reach k (dropped, and said), the packed run says ksae-train's lines and writes its config.json, checkpoint
    (the centring mean with it) and metrics, new and then resumed, as the same run alone."""
    from ksae_cupy.session import train_run

    built = []
    for name in ("new_job", "resumed_trainer"):
        def spy(*args, _name=name, _real=getattr(train_run, name)):
            built.append(_name)
            return _real(*args)
        monkeypatch.setattr(train_run, name, spy)
    options = dict(hidden=40, k=4, batch_size=100, lr="auto", seed=4, center_input=True, k_start=20)
    said = []
    packed, alone = tmp_path / "packed", tmp_path / "alone"
    for epochs in (1, 2):  # 1: a new run; 2: the same folder resumed, its epochs raised
        maker = ["new_job" if epochs == 1 else "resumed_trainer"]
        built.clear()
        train_packed([TrainConfig(**options, epochs=epochs)], data, CPU, [packed],
                     settings={"threads": 1, "device": "cpu"}, log=said.append)
        assert built == maker
        args = ["synthetic", "--hidden", "40", "--k", "4", "--epochs", "1", "--batch-size", "100", "--lr", "auto",
                "--seed", "4", "--center-input", "--k-start", "20", "--threads", "1", "--device", "cpu",
                "--run-dir", str(alone)] if epochs == 1 else ["--resume", str(alone), "--epochs", "2"]
        built.clear()
        result = CliRunner().invoke(train_command, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert built == maker  # ksae-train alone made its run by the same function
        assert_same_run(packed, alone)
        if epochs == 1:
            lone_lines = [line for line in result.output.splitlines() if line.startswith(("note: ", "--lr auto: "))]
            assert len(lone_lines) == 2 and [f"{packed}: {line}" for line in lone_lines] == said[:2]
    assert load_checkpoint(packed / "checkpoint.h5").preprocess["input_mean"].tolist() == \
        load_checkpoint(alone / "checkpoint.h5").preprocess["input_mean"].tolist()
    records = [json.loads((folder / "config.json").read_text()) for folder in (packed, alone)]
    for record in records:
        for key in ("run_dir", "run_id", "provenance"):
            record.pop(key)
    assert records[0] == records[1]
    assert records[0]["train"]["lr_auto"] and records[0]["train"]["k_start"] is None
