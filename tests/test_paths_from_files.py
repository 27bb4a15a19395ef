"""Paths read from files the user did not type stay where they belong, tested with crafted files: the
checkpoint manifest's entries (under the clone's results/, a commit git cannot read as an option), an
export's tensors (inside its data), a config.json's recorded data files (regular files, never a folder, a
device or a pipe)."""
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy.errors import KsaeError
from ksae_cupy.reports.kept_checkpoints import MANIFEST, read_manifest
from runfolder import make_run

GOOD = {"path": "results/runs/a/checkpoint.h5", "commit": "a" * 40, "sha256": "b" * 64, "bytes": 10}


def manifest(root: Path, **changes) -> Path:
    (root / "results").mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).write_text(json.dumps({"checkpoints": [{**GOOD, **changes}]}))
    return root


def test_a_sound_entry_is_read(tmp_path):
    assert [entry.path for entry in read_manifest(manifest(tmp_path))] == [GOOD["path"]]


@pytest.mark.parametrize("changes, words", [
    ({"path": "../outside/checkpoint.h5"}, "not a checkpoint.h5 under results/"),
    ({"path": "results/../../checkpoint.h5"}, "not a checkpoint.h5 under results/"),
    ({"path": "/etc/checkpoint.h5"}, "not a checkpoint.h5 under results/"),
    ({"path": "results/runs/a/config.json"}, "not a checkpoint.h5 under results/"),
    ({"path": "README.md"}, "not a checkpoint.h5 under results/"),
    ({"commit": "--upload-pack=touch /tmp/owned"}, "not 40 hex digits"),
    ({"commit": "HEAD"}, "not 40 hex digits"),
    ({"sha256": "x"}, "not 64 hex digits"),
    ({"bytes": -1}, "size of -1 bytes"),
    ({"path": 7}, "is not a path")])
def test_a_crafted_manifest_entry_is_refused(tmp_path, changes, words):
    with pytest.raises(KsaeError, match=words):
        read_manifest(manifest(tmp_path, **changes))


def test_an_entry_through_a_link_out_of_results_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "runs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(KsaeError, match="leads out of"):
        read_manifest(manifest(tmp_path))


def safetensors(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("entry", [{"dtype": "F32", "shape": [2], "data_offsets": [0, 64]},   # past the data
                                   {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]},   # before it
                                   {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]},    # not its size
                                   {"dtype": "F32", "shape": [2]}])                           # no offsets
def test_an_exports_tensor_stays_inside_its_data(tmp_path, entry):
    from ksae_cupy.session.export import read_safetensors

    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors({"encoder.weight": entry}, np.zeros(2, "<f4").tobytes()))
    with pytest.raises(KsaeError, match="encoder.weight"):
        read_safetensors(path)


def test_an_exports_sound_tensor_is_read(tmp_path):
    from ksae_cupy.session.export import read_safetensors

    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                                 np.array([1, 2], "<f4").tobytes()))
    assert read_safetensors(path)[0]["w"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("kind", ["folder", "device"])
def test_a_config_that_records_a_non_file_as_data_is_refused(tmp_path, kind):
    from ksae_cupy.cli.evaluate import eval_command

    if kind == "folder":
        target = tmp_path / "rows.npy"
        target.mkdir()
    else:
        target = tmp_path / "zeros.npy"
        target.symlink_to("/dev/zero")
    run = make_run(tmp_path / "run", np.ones((4, 8), np.float32), k=1, dataset=str(target))
    result = CliRunner().invoke(eval_command, [str(run), "--device", "cpu", "--threads", "1"])
    assert_one_line_error(result, f"config.json records dataset {target}", "not a regular file", status=2)


def test_a_config_that_records_a_non_text_data_path_is_refused(tmp_path):
    from ksae_cupy.datasets.user_files import DataSpec

    with pytest.raises(KsaeError, match="not a file name"):
        DataSpec.from_record("rows.npy", {"labels": 5})
