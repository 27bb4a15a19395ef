"""``ksae-bench finetune`` on tiny shapes: it validates, times the dense and the sparse step, and writes JSON."""
import json

import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy.cli.bench import bench_command
from ksae_cupy.cpu import numba_kernels as cpu_kernels

TINY = ["finetune", "--dim", "30", "--hidden", "40", "--classes", "5", "--kept", "6", "--batch-size", "16",
        "--repeats", "2", "--steps", "2"]


def test_bench_finetune_times_dense_and_sparse_on_one_and_two_layers_and_writes_json(tmp_path):
    result = CliRunner().invoke(bench_command, [*TINY, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("finetune-cpu-*.json")
    data = json.loads(path.read_text())
    assert data["benchmark"] == "finetune-step" and data["phase"] == "all"
    assert data["shape"] == {"N": 16, "D": 30, "H": 40, "C": 5, "kept": 6}
    assert [net["shape"] for net in data["nets"]] == ["30-40-5", "30-40-40-5"]
    for net in data["nets"]:
        assert {"dense", "sparse", "encoder_XW1"} <= set(net["ms"])
        assert ("sparse_scipy" in net["ms"]) == cpu_kernels.enabled()
        assert all(value > 0 for value in net["ms"].values())
        errors = net["validation_max_rel_error"]
        assert errors["sparse_float64"] < 1e-9
        assert max(errors.values()) < 1e-3
    assert data["threads"] == 1
    assert data["meta"]["commit"] and data["meta"]["date"] and data["meta"]["numpy"]
    cpu_kernels.set_threads(None)


@pytest.mark.parametrize("args,fragment", [
    (["--kept", "50"], "--kept 50 is not allowed"),
    (["--layers", "1,x"], "--layers '1,x' is not allowed"),
    (["--repeats", "0"], "--repeats 0 is not allowed"),
])
def test_bench_finetune_bad_input_is_one_line(tmp_path, args, fragment):
    result = CliRunner().invoke(bench_command, [*TINY, *args, "--out", str(tmp_path)])
    assert_one_line_error(result, fragment, status=2)
    assert not list(tmp_path.glob("*.json"))
