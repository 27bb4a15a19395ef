"""bin/gpu-campaign's option rules and run specs, read from the package (the dry runs are in
tests/bin/test_gpu_campaign.py)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from ksae_cupy.recipes.campaign import check_options, parse_run


def options(tmp_path: Path, **given) -> SimpleNamespace:
    defaults = dict(out_dir=tmp_path / "out", budget_minutes=9.0, stage=None, benchmarks=False, dry_run=False, device="gpu", tiny=False,
                    ks=None, epochs=None, side_by_side=2, stop_after_epochs=None)
    return SimpleNamespace(**{**defaults, **given})


@pytest.mark.parametrize("spec, run", [
    ("25", ("k25", 25, [])),
    ("40+auxk256+center", ("k40-auxk256-center", 40, ["--aux-k", "256", "--center-input"])),
    ("25+seed1", ("k25-seed1", 25, ["--seed", "1"])),
    ("0", None), ("x", None), ("25+dropout", None), ("25+auxk0", None),
])
def test_a_run_spec_names_its_folder_and_its_ksae_train_options(spec, run):
    assert parse_run(spec) == run


def test_dry_run_is_the_cpu_and_tiny_shapes_and_ks_become_runs(tmp_path):
    args = options(tmp_path, dry_run=True, ks="3,2+center")
    assert check_options(args) is None
    assert (args.device, args.tiny) == ("cpu", True)
    assert args.ks == [("k3", 3, []), ("k2-center", 2, ["--center-input"])]


def test_benchmarks_are_the_stages_of_one_call(tmp_path):
    args = options(tmp_path, benchmarks=True)
    assert check_options(args) is None
    assert args.stage == ["env", "step", "epoch", "packed", "grid", "collect"]


@pytest.mark.parametrize("given, fragment", [
    (dict(device="cpu"), "--device cpu needs --tiny"),
    (dict(device="gpu:x"), "--device 'gpu:x'"),
    (dict(stage=["env", "bench"]), "--stage 'bench'"),
    (dict(epochs=0), "--epochs 0"),
    (dict(ks="25,"), "--ks ''"),
])
def test_the_first_bad_option_is_named(tmp_path, given, fragment):
    message = check_options(options(tmp_path, **given))
    assert message is not None and message.startswith(fragment) and "\n" not in message
