"""Layer 2's codes origin: one that cannot be read is said when layer 2 trains (not found out at the
fine-tuning), and the fine-tuning's alpha is checked against the alpha the codes were written with."""
import numpy as np

from clicheck import FINETUNE, SESSION, assert_one_line_error, invoke
from ksae_cupy.cli.data import data_command
from ksae_cupy.cli.finetune import finetune_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.session.runs import RunFolder



def layer1(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.random((300, 16)).astype(np.float32)
    np.savez(tmp_path / "rows.npz", X=X, y=(X[:, 0] > 0.5).astype(np.int64))
    invoke(train_command, [tmp_path / "rows.npz", "--hidden", 12, "--k", 3, "--epochs", 1, "--batch-size", 50,
                           "--run-dir", tmp_path / "layer1", *SESSION])
    return tmp_path / "layer1"


def train_layer2(codes, run_dir, expect=0):
    return invoke(train_command, [codes, "--hidden", 8, "--k", 2, "--epochs", 1, "--batch-size", 50,
                                  "--run-dir", run_dir, "--device", "cpu", "--threads", "1"], expect)


def test_an_unreadable_codes_origin_is_said_when_layer_2_trains(tmp_path):
    first = layer1(tmp_path)
    invoke(data_command, ["codes", first, tmp_path / "codes.npy"])
    (tmp_path / "codes.json").write_text("{ garbage")
    result = train_layer2(tmp_path / "codes.npy", tmp_path / "layer2")
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ") and "codes.json" in line]
    assert len(notes) == 1 and "cannot be read as the codes' origin (not JSON)" in notes[0], result.stderr
    assert "codes_origin" not in RunFolder(tmp_path / "layer2").read_config()


def test_finetuning_at_another_alpha_than_the_codes_is_refused(tmp_path):
    first = layer1(tmp_path)
    invoke(data_command, ["codes", first, tmp_path / "codes.npy", "--alpha", "1"])
    train_layer2(tmp_path / "codes.npy", tmp_path / "layer2")
    result = invoke(finetune_command, [first, tmp_path / "layer2", "--alpha", "3", "--run-dir", tmp_path / "ft",
                                       *FINETUNE], expect=None)
    assert_one_line_error(result, "--alpha 3 differs from the alpha layer 2", "ksae-data codes --alpha 1",
                          "give --alpha 1", status=2)
    invoke(finetune_command, [first, tmp_path / "layer2", "--alpha", "1", "--run-dir", tmp_path / "ft2", *FINETUNE])
