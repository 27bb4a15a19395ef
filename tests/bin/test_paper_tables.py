"""bin/paper-tables: Tables err_mnist and fn_mnist from run folders the test writes itself, in the formats
ksae-train, ksae-baseline, ksae-eval and ksae-finetune write (config.json, metrics.jsonl, eval.json,
finetune.json); what is left to run, and --run's order of work through a stand-in for the child processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from clicheck import assert_one_line_error
from ksae_cupy.reports import paper_tables as tables
from ksae_cupy.reports.children import STOP_SIGNALS, Children

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bin" / "paper-tables"


# -- run folders as the commands write them ---------------------------------------------------------

def _write(folder: Path, config: dict, epochs_done: int, checkpoint: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e, "step": 391 * e, "seconds": 5.0}) + "\n"
                                                  for e in range(1, epochs_done + 1)))
    if checkpoint:
        (folder / "checkpoint.h5").write_bytes(b"not read by the tables")
    return folder


def train_run(folder, k, epochs, seed=0, done=None, test=None, valid=0.02, raw=None, dataset="mnist", **train):
    """A ksae-train folder; with ``test``, ksae-eval's eval.json at its last epoch."""
    done = epochs if done is None else done
    config = {"kind": "ksae-train", "dataset": dataset, "device": "cpu", "run_id": "x",
              "train": {"hidden": 1000, "k": k, "epochs": epochs, "seed": seed, "activation": "linear", **train}}
    _write(folder, config, done)
    if test is not None:
        result = {"epoch": done, "k": k, "hidden": 1000, "dataset": dataset, "alphas": [1.0, 2.0, 3.0, 4.0],
                  "l2_grid": [1e-3, 1e-4, 1e-5],
                  "features": {"test_error": test, "selected": {"alpha": 3.0, "l2": 1e-4, "valid_error": valid}}}
        if raw is not None:
            result["raw_baseline"] = {"test_error": raw, "selected": {"alpha": None, "l2": 1e-4, "valid_error": 0.08}}
        (folder / "eval.json").write_text(json.dumps(result))
    return folder


def baseline_run(folder, model, epochs, seed=0, done=None, test=None):
    done = epochs if done is None else done
    config = {"kind": "ksae-baseline", "dataset": "mnist", "model": model, "threads": 1,
              "baseline": {"model": model, "hidden": 1000, "epochs": epochs, "seed": seed, "lr": 0.01,
                           "weight_decay": 0.0002}}
    _write(folder, config, done)
    if test is not None:
        (folder / "eval.json").write_text(json.dumps({"epoch": done, "model": model, "hidden": 1000, "features": {
            "test_error": test, "selected": {"alpha": None, "l2": 1e-5, "valid_error": 0.03}}}))
    return folder


def finetune_run(folder, pretrained=(), seed=0, epochs=200, phases=("all",), done=None, test=None, **config):
    """A ksae-finetune folder (``pretrained``: the sources config.json records)."""
    total = epochs * len(phases)
    kept = [75] * max(1, len(pretrained)) if not config.get("baseline") else [None] * config.pop("layers", 1)
    full = {"kind": "ksae-finetune", "dataset": "mnist", "alpha": 3.0, "pretrained": list(pretrained),
            "no_pretraining": False, "baseline": None, "pretrain_epochs": None,
            "finetune": {"epochs": epochs, "phases": list(phases), "kept": kept, "seed": seed}, **config}
    _write(folder, full, total if done is None else done)
    if test is not None:
        (folder / "finetune.json").write_text(json.dumps({"test_error": test, "valid_error": test + 0.001,
                                                          "epochs_per_phase": epochs, "phases": list(phases)}))
    return folder


def edit_config(folder: Path, finetune: dict | None = None, **top) -> None:
    """Rewrite ``folder``'s config.json: the keys ``top`` set, its "finetune" section updated by ``finetune``."""
    config = json.loads((folder / "config.json").read_text())
    config.update(top)
    if finetune is not None:
        config["finetune"].update(finetune)
    (folder / "config.json").write_text(json.dumps(config))


def ksparse_source(run: Path, epochs: int) -> dict:
    return {"run_dir": str(run), "dataset": "mnist", "k": 25, "hidden": 1000, "epochs_trained": epochs}


def cells_of(line: str) -> list[str]:
    return [c.strip() for c in line.strip("|").split("|")]


def line_of(markdown: str, label: str, epochs: str) -> list[str]:
    """The cells of the table line of row ``label`` at ``epochs``."""
    for line in markdown.splitlines():
        cells = cells_of(line)
        if len(cells) == len(tables.HEADER) and cells[0] == label and cells[5] == epochs:
            return cells
    raise AssertionError(f"no line {label!r} at {epochs} epochs in:\n{markdown}")


def label_ending(markdown: str, suffix: str) -> str:
    """The label of the first line whose label ends with ``suffix``."""
    return next(cells[0] for cells in map(cells_of, markdown.splitlines()) if cells[0].endswith(suffix))


def noted_and_own_lines(markdown: str, note: str, epochs: str) -> tuple[list[str], list[str]]:
    """The cells of the line at ``epochs`` whose label ends with ``note`` (what sets its runs apart), and of
    its row's own line, the label without the note."""
    label = label_ending(markdown, note)
    return line_of(markdown, label, epochs), line_of(markdown, label.removesuffix(note), epochs)


def paper_tables(*args: str, cwd: Path, hash_seed: str | None = None):
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    if hash_seed is not None:  # the order of sets and dicts of strings, which the tables must not follow
        env["PYTHONHASHSEED"] = hash_seed
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)  # against a hang only
    return SimpleNamespace(exit_code=proc.returncode, returncode=proc.returncode, stdout=proc.stdout,
                           stderr=proc.stderr, output=proc.stdout + proc.stderr)


def tables_of(root: Path, tmp_path: Path) -> str:
    """The tables paper-tables writes of the runs under ``root`` (run in ``tmp_path``); it must succeed."""
    out = tmp_path / "tables.md"
    result = paper_tables("--runs-root", str(root), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return out.read_text()


@pytest.fixture
def root(tmp_path):
    """Run folders of every kind: done, stopped, trained but not evaluated, several seeds, variants; under
    results/runs, as in the repository (a manifest's entries are paths under the clone's results/)."""
    runs = tmp_path / "results" / "runs"
    for seed, test in ((0, 0.0180), (1, 0.0190), (2, 0.0200)):  # one row, three seeds
        train_run(runs / f"k25-seed{seed}", 25, 5000, seed=seed, test=test, raw=0.0738 if seed == 0 else None)
    train_run(runs / "k25-short", 25, 500, test=0.0159)  # the same row at another length: its own line
    train_run(runs / "k40", 40, 5000, done=1200)  # stopped
    train_run(runs / "k10", 10, 5000)  # trained, not evaluated
    train_run(runs / "k25-auxk", 25, 5000, test=0.0166, aux_k=256)  # a variant: no row of the paper's
    train_run(runs / "fashion", 25, 5000, test=0.15, dataset="fashion-mnist")  # another dataset
    baseline_run(runs / "rbm", "rbm", 500, test=0.0200)
    baseline_run(runs / "dropout", "dropout-ae", 500, done=90)
    finetune_run(runs / "ft-ksparse", [ksparse_source(runs / "k25-seed0", 5000)], test=0.0156)
    finetune_run(runs / "ft-deep", [ksparse_source(runs / "k25-seed0", 5000), ksparse_source(runs / "x", 5000)],
                 phases=("softmax", "top", "all"), done=250)
    finetune_run(runs / "ft-rbm", [{"run_dir": str(runs / "rbm"), "model": "rbm", "hidden": 1000,
                                    "epochs_trained": 500}], test=0.0130)
    finetune_run(runs / "ft-none", no_pretraining=True, test=0.0195)
    finetune_run(runs / "ft-relu", no_pretraining=True, units="relu", test=0.0169)  # ksae-finetune --units relu
    return runs


# -- which row each folder is ----------------------------------------------------------------------------

def test_each_folder_is_placed_in_its_row_by_its_config(root):
    placed = {f.state.path.name: (f.table, f.key, str(f.length), f.seed) for f in tables.collect(root)}
    assert placed == {
        "k25-seed0": ("err_mnist", "k25", "5000", 0), "k25-seed1": ("err_mnist", "k25", "5000", 1),
        "k25-seed2": ("err_mnist", "k25", "5000", 2), "k25-short": ("err_mnist", "k25", "500", 0),
        "k40": ("err_mnist", "k40", "5000", 0), "k10": ("err_mnist", "k10", "5000", 0),
        "rbm": ("err_mnist", "rbm", "500", 0), "dropout": ("err_mnist", "dropout-ae", "500", 0),
        "ft-ksparse": ("fn_mnist", "ksparse", "5000 + 200", 0),
        "ft-deep": ("fn_mnist", "deep-ksparse", "5000 + 200 x 3", 0),
        "ft-rbm": ("fn_mnist", "rbm", "500 + 200", 0), "ft-none": ("fn_mnist", "no-pretraining", "200", 0),
        "ft-relu": ("fn_mnist", "no-pretraining-relu", "200", 0)}


def test_a_fine_tuning_of_a_run_trained_beyond_the_paper_is_no_row_of_the_paper(root):
    centred = {**ksparse_source(root / "k25-centred", 500), "activation": "linear", "aux_k": 0, "center_input": True}
    finetune_run(root / "ft-centred", [centred], test=0.0120)
    paper_way = {**ksparse_source(root / "k25-short", 500), "activation": "linear", "aux_k": 0, "center_input": False}
    finetune_run(root / "ft-paper-way", [paper_way], seed=1, test=0.0150)
    # a folder written before the recipe was recorded: its pretrained run's own config.json says it
    train_run(root / "k25-auxk-short", 25, 500, test=0.0150, aux_k=256)
    finetune_run(root / "ft-legacy-auxk", [ksparse_source(root / "k25-auxk-short", 500)], test=0.0120)
    placed = {f.state.path.name: (f.key, str(f.length), f.seed) for f in tables.collect(root)}
    assert "ft-centred" not in placed and "ft-legacy-auxk" not in placed
    assert placed["ft-paper-way"] == ("ksparse", "500 + 200", 1)


def test_a_fine_tuning_written_before_epochs_were_recorded_reads_them_from_its_pretrained_run(root):
    source = ksparse_source(root / "k25-seed0", 5000)
    del source["epochs_trained"]
    source["run_dir"] = "/elsewhere/k25-seed0"  # moved here with its pretrained run, beside it
    finetune_run(root / "ft-legacy", [source], seed=7, test=0.0160)
    found = {f.state.path.name: f for f in tables.collect(root)}
    assert str(found["ft-legacy"].length) == "5000 + 200"


def test_a_deep_fine_tunings_layers_copied_into_its_own_folder_are_found_where_they_were_moved(root):
    """A deep fine-tuning moved with its layers (``pretrain/ksparse2`` inside its own folder, run elsewhere): the
    layer's config.json, found by the folder it ran in, says it was trained on a GPU, so the row says so (layer 2
    only: layer 1 ran on the CPU)."""
    deep = root / "fn-deep"
    layer2 = deep / "pretrain" / "ksparse2"
    train_run(layer2, 25, 5000)
    edit_config(layer2, device="gpu:0", run_dir="/gone/fn-deep/pretrain/ksparse2")
    train_run(root / "k25-layer1", 25, 5000)
    layers = [ksparse_source(root / "k25-layer1", 5000), {**ksparse_source(Path("/gone/fn-deep/pretrain/ksparse2"), 5000)}]
    finetune_run(deep / "finetune" / "deep_ksparse", layers, phases=("top", "bottom", "all"), test=0.0130)
    found = {f.state.path.name: f for f in tables.collect(root)}
    assert found["deep_ksparse"].on_gpu
    assert found["deep_ksparse"].notes == ("layer 2 pretrained on a GPU",)


# -- the tables ----------------------------------------------------------------------------------------

def test_the_report_shows_each_row_beside_the_paper_with_seeds_as_mean_and_spread(root, tmp_path):
    out = tmp_path / "tables.md"
    result = paper_tables("--runs-root", str(root), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    k25 = line_of(text, "k-Sparse Autoencoder, k = 25", "5000")
    # 1.80, 1.90, 2.00%: mean 1.90%, standard deviation 0.10 points; the paper's 1.35%: 0.55 points above
    assert k25[1:7] == ["1.35%", "1.90% ± 0.10", "2.00% ± 0.00", "+0.55", "5000", "0, 1, 2"]
    assert k25[8] == "k25-seed0, k25-seed1, k25-seed2"
    assert line_of(text, "k-Sparse Autoencoder, k = 25", "500")[1:7] == ["1.35%", "1.59%", "2.00%", "+0.24", "500", "0"]
    assert line_of(text, "Raw Pixels", "-")[1:5] == ["7.20%", "7.38%", "8.00%", "+0.18"]
    assert line_of(text, "RBM", "500")[1:5] == ["1.81%", "2.00%", "3.00%", "+0.19"]
    assert line_of(text, "k-Sparse AE + F.T. (k=25)", "5000 + 200")[1:5] == ["1.08%", "1.56%", "1.66%", "+0.48"]
    assert line_of(text, "RBM + F.T.", "500 + 200")[1:4] == ["1.24%", "1.30%", "1.40%"]
    # the paper's one "without pre-training" figure, read both ways: k-sparse units, a plain ReLU net
    assert line_of(text, "Without Pre-Training (k-sparse units, alpha*k = 75 kept)", "200")[1:3] == ["1.60%", "1.95%"]
    plain = line_of(text, "Without Pre-Training (a plain ReLU network)", "200")
    assert plain[1:3] == ["1.60%", "1.69%"] and "--units relu" in plain[7] and "--k" not in plain[7]
    # where a row stands when it is not done, and what is missing
    assert line_of(text, "k-Sparse Autoencoder, k = 40", "5000")[2] == "stopped at epoch 1200 of 5000"
    assert line_of(text, "k-Sparse Autoencoder, k = 10", "5000")[2] == "trained (5000 epochs), not evaluated"
    assert line_of(text, "Deep k-Sparse AE + F.T. (k=25, layer-wise pre-training)", "5000 + 200 x 3")[2] == \
        "stopped at epoch 250 of 600"
    assert line_of(text, "Denoising Autoencoder (20% input dropout)", "500")[2] == "missing"
    assert "auxk" not in text and "fashion" not in text  # neither is a row of the paper's tables
    assert result.stdout.splitlines()[0] == f"tables: {out}"


def test_a_run_trained_on_a_gpu_has_its_own_line_and_is_not_counted_as_a_seed(root, tmp_path):
    gpu = train_run(root / "k25-gpu", 25, 5000, seed=0, test=0.0164, valid=0.0184)
    edit_config(gpu, device="gpu:0")
    text = tables_of(root, tmp_path)
    assert line_of(text, "k-Sparse Autoencoder, k = 25", "5000")[2:7] == ["1.90% ± 0.10", "2.00% ± 0.00", "+0.55",
                                                                         "5000", "0, 1, 2"]
    gpu_line = line_of(text, "k-Sparse Autoencoder, k = 25, trained on a GPU", "5000")
    assert gpu_line[2:7] == ["1.64%", "1.84%", "+0.29", "5000", "0"] and gpu_line[8] == "k25-gpu"
    assert "--device gpu" in gpu_line[7] and "--device" not in line_of(text, "k-Sparse Autoencoder, k = 25", "5000")[7]
    # a fine-tuning on the CPU of the GPU run: its own line too
    finetune_run(root / "ft-of-gpu", [ksparse_source(gpu, 5000)], test=0.0159)
    text = tables_of(root, tmp_path)
    assert line_of(text, "k-Sparse AE + F.T. (k=25)", "5000 + 200")[2] == "1.56%"
    assert line_of(text, "k-Sparse AE + F.T. (k=25), pretrained on a GPU", "5000 + 200")[2] == "1.59%"
    # what is left to run is planned from the CPU runs: the GPU run of seed 0 stands for none of them
    assert [f.state.path.name for f in [tables._match(tables.collect(root), "err_mnist", "k25",
                                                      tables.Length(5000), 0)]] == ["k25-seed0"]


def test_a_deep_stack_of_baseline_runs_is_the_deep_dropout_row_on_a_line_naming_its_softmax_rate(root, tmp_path):
    layer1 = baseline_run(root / "dropout-l1", "dropout-ae", 500, test=0.0199)
    sources = [{"run_dir": str(layer1), "model": "dropout-ae", "hidden": 1000, "epochs_trained": 500},
               {"run_dir": "/elsewhere/layer2", "model": "dropout-ae", "hidden": 1000, "epochs_trained": 500}]
    for name, softmax, test, seed in (("ft-deep-dropout", 0.01, 0.0110, 0), ("ft-deep-dropout-paper", None, 0.0126, 0),
                                      ("ft-deep-dropout-typed", 1.0, 0.0128, 1)):
        folder = finetune_run(root / name, sources, seed=seed, phases=("softmax", "top", "all"), test=test)
        edit_config(folder, finetune=dict(kept=[None, None], softmax_lr_start=softmax, lr_start=1.0))
    mixed = finetune_run(root / "ft-mixed", [sources[0], {**sources[1], "model": "rbm"}], phases=("softmax", "top",
                                                                                                  "all"), test=0.009)
    placed = {f.state.path.name: (f.key, f.notes) for f in tables.collect(root)}
    assert placed["ft-deep-dropout"] == ("deep-dropout-ae", ("softmax phase from lr 0.01",))
    assert placed["ft-deep-dropout-paper"] == ("deep-dropout-ae", ()) and mixed.name not in placed
    # a softmax rate equal to the schedule's own start is the paper's recipe, on its row
    assert placed["ft-deep-dropout-typed"] == ("deep-dropout-ae", ())
    label = "Deep Dropout AE + F.T. (layer-wise pre-training, 50% hidden)"
    text = tables_of(root, tmp_path)
    assert line_of(text, label, "500 + 200 x 3")[2] == "1.27% ± 0.01"  # seeds 0 and 1 (the typed rate)
    own = line_of(text, label + ", softmax phase from lr 0.01", "500 + 200 x 3")
    assert own[2] == "1.10%" and own[8] == "ft-deep-dropout" and "--softmax-lr-start 0.01" in own[7]
    assert "--phases" not in line_of(text, label, "500 + 200 x 3")[7]  # the deep default: softmax, top, all


def test_a_deep_row_whose_layer_2_trained_other_epochs_than_layer_1_says_so_on_its_own_line(root, tmp_path):
    finetune_run(root / "ft-deep-short-layer2", [ksparse_source(root / "k25-seed0", 5000),
                                                 ksparse_source(Path("/elsewhere/layer2"), 500)],
                 phases=("softmax", "top", "all"), test=0.0135)
    placed = {f.state.path.name: str(f.length) for f in tables.collect(root)}
    assert placed["ft-deep-short-layer2"] == "5000 (layer 2: 500) + 200 x 3"
    assert placed["ft-deep"] == "5000 + 200 x 3"  # both layers 5000: said once
    text = tables_of(root, tmp_path)
    cells = line_of(text, "Deep k-Sparse AE + F.T. (k=25, layer-wise pre-training)", "5000 (layer 2: 500) + 200 x 3")
    assert cells[2] == "1.35%" and cells[8] == "ft-deep-short-layer2"
    assert "ksae-finetune --resume results/runs/ft-deep`" in text  # the asked row (both layers 5000) is still to finish


def deep_dropout_finetune(root, name, phases, test):
    """A fine-tuning of a two-layer dropout AE stack (layer 1 a baseline run, every unit kept)."""
    layer1 = root / "dropout-l1"
    if not layer1.exists():
        baseline_run(layer1, "dropout-ae", 500, test=0.0199)
    sources = [{"run_dir": str(layer1), "model": "dropout-ae", "hidden": 1000, "epochs_trained": 500},
               {"run_dir": "/elsewhere/layer2", "model": "dropout-ae", "hidden": 1000, "epochs_trained": 500}]
    folder = finetune_run(root / name, sources, phases=phases, test=test)
    edit_config(folder, finetune=dict(kept=[None, None]))
    return folder


def test_a_deep_stack_fine_tuned_jointly_is_its_own_line_whose_command_names_the_phases(root, tmp_path):
    deep_dropout_finetune(root, "ft-deep-joint", ("all",), 0.0133)
    joint = line_of(tables_of(root, tmp_path), "Deep Dropout AE + F.T. (layer-wise pre-training, 50% hidden)", "500 + 200")
    assert joint[2] == "1.33%" and joint[8] == "ft-deep-joint" and "--phases all" in joint[7]


def test_lines_of_one_row_at_equal_epochs_come_out_in_one_order_whatever_the_hash_seed(root, tmp_path):
    """The layer-wise (200 x 3) and joint (200) deep dropout lines share pretraining and fine-tuning epochs;
    their order once followed the set they were gathered in, so results/paper-tables.md changed between runs."""
    deep_dropout_finetune(root, "ft-deep-joint", ("all",), 0.0133)
    deep_dropout_finetune(root, "ft-deep-layerwise", ("softmax", "top", "all"), 0.0123)
    orders = set()
    for hash_seed in ("1", "2", "3", "4"):
        out = tmp_path / f"tables-{hash_seed}.md"
        proc = paper_tables("--runs-root", str(root), "--out", str(out), cwd=tmp_path, hash_seed=hash_seed)
        assert proc.returncode == 0, proc.stderr
        orders.add(tuple(line.split("|")[-2].strip() for line in out.read_text().splitlines()
                         if line.startswith("| Deep Dropout AE")))
    assert orders == {("ft-deep-layerwise", "ft-deep-joint")}, orders  # the longer fine-tuning (3 phases) first


def test_a_pretrained_run_copied_under_another_name_is_named_where_it_is_now(root, tmp_path):
    copy = train_run(root / "k25-copied", 25, 500, seed=4, test=0.0170)
    edit_config(copy, run_dir="/elsewhere/k25-original")
    finetune_run(root / "ft-of-copy", [ksparse_source(Path("/elsewhere/k25-original"), 500)], seed=4, test=0.0150)
    command = line_of(tables_of(root, tmp_path), "k-Sparse AE + F.T. (k=25)", "500 + 200")[7]
    assert command.startswith("`ksae-finetune results/runs/k25-copied --epochs 200") and "/elsewhere" not in command


def test_without_run_each_missing_row_says_the_command_that_makes_it(root, tmp_path):
    result = paper_tables("--runs-root", str(root), "--out", str(tmp_path / "t.md"), cwd=root)
    left = [line[len("left: "):] for line in result.stdout.splitlines() if line.startswith("left: ")]
    assert "ksae-train --resume k40" in left  # stopped: resumed
    assert left.index("ksae-train --resume k40") + 1 == left.index("ksae-eval k40 --threads 1")
    assert "ksae-eval k10 --threads 1" in left  # trained: evaluated only
    assert "ksae-baseline --resume dropout" in left
    assert ("ksae-baseline mnist --model denoising-ae --hidden 1000 --lr 0.01 --weight-decay 0 --epochs 500 "
            "--seed 0 --threads 1 --run-dir mnist-denoising-ae-500") in left
    # a fine-tuning row waits for the run it starts from, and starts from it
    assert left.index("ksae-eval mnist-denoising-ae-500 --threads 1 --max-iter 1000") < left.index(
        "ksae-finetune mnist-denoising-ae-500 --epochs 200 --seed 0 --threads 1 --run-dir fn-denoising-ae-500-200")
    assert "ksae-finetune --resume ft-deep" in left
    assert not any("k25-seed" in line or "ft-ksparse" in line or "ft-rbm" in line for line in left)  # done


def test_several_seeds_are_asked_for_and_only_the_missing_ones_planned(root, tmp_path):
    settings = tables.Settings(seeds=(0, 1, 2, 3))
    targets = tables.plan(root, [("err_mnist", "k25")], settings)
    assert [(t.seed, t.folder.name, [c for c, _ in t.steps]) for t in targets] == [
        (0, "k25-seed0", []), (1, "k25-seed1", []), (2, "k25-seed2", []),
        (3, "mnist-k25-5000-seed3", ["ksae-train", "ksae-eval"])]
    assert "--seed" in targets[3].steps[0][1] and targets[3].steps[0][1][targets[3].steps[0][1].index("--seed") + 1] == 3


@pytest.mark.parametrize("args, fragments", [
    (["--rows", "k25,k99"], ["--rows", "k99", "k25"]),
    (["--seeds", "0,x"], ["--seeds", "0,x", "whole numbers"]),
    (["--ksparse-epochs", "0"], ["--ksparse-epochs 0", "positive"]),
])
def test_bad_options_are_one_line_errors_and_write_nothing(root, tmp_path, args, fragments):
    out = tmp_path / "t.md"
    result = paper_tables("--runs-root", str(root), "--out", str(out), *args, cwd=tmp_path)
    assert_one_line_error(result, *fragments, status=2)
    assert not out.exists()


def test_a_missing_runs_root_is_an_error_without_run(tmp_path):
    result = paper_tables("--runs-root", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert_one_line_error(result, "--runs-root", "nowhere", "no such folder", status=2)


# -- --run: the order of work, through a stand-in for the child processes -------------------------------------

class FakeChildren:
    """Does what each command would do to the run folders, at once; records the commands."""

    received = None  # no stop signal

    def __init__(self, fail_on: str | None = None, status: int = 2, message: str = "error: --k 2000 is not allowed"):
        self.commands, self.fail_on, self.found = [], fail_on, {}
        self.status, self.message = status, message

    def check_stop(self):
        pass

    def run(self, step, command, options):
        self.commands.append((command, [str(o) for o in options]))
        if "--run-dir" in options:  # what the command finds in its folder when it starts
            folder = Path(options[options.index("--run-dir") + 1])
            self.found[folder.name] = sorted(p.name for p in folder.iterdir()) if folder.exists() else None
        if command == self.fail_on:
            if command == "ksae-train" and "--run-dir" in options:  # as the command does: config.json first
                train_run(Path(options[options.index("--run-dir") + 1]), int(options[options.index("--k") + 1]),
                          int(options[options.index("--epochs") + 1]), seed=int(options[options.index("--seed") + 1]),
                          done=0)
            return self.status, ["epoch 1 ...", self.message]
        options = list(options)
        if command == "ksae-train" and options[0] == "--resume":
            folder = Path(options[1])
            config = json.loads((folder / "config.json").read_text())
            _write(folder, config, config["train"]["epochs"])
        elif command == "ksae-train":
            folder = Path(options[options.index("--run-dir") + 1])
            train_run(folder, int(options[options.index("--k") + 1]), int(options[options.index("--epochs") + 1]),
                      seed=int(options[options.index("--seed") + 1]))
        elif command == "ksae-eval":
            folder = Path(options[0])
            k = json.loads((folder / "config.json").read_text())["train"]
            train_run(folder, k["k"], k["epochs"], seed=k["seed"], test=0.02)
        return 0, ["done"]


def test_run_resumes_what_stopped_starts_what_is_missing_and_skips_what_is_done(root, tmp_path):
    out, children = tmp_path / "t.md", FakeChildren()
    rows = [("err_mnist", "k25"), ("err_mnist", "k40")]
    left = tables.build(root, out, rows, tables.Settings(seeds=(0, 3)), lambda c, a: c, "script", children)
    assert [(c, o[:2]) for c, o in children.commands] == [
        ("ksae-train", ["mnist", "--hidden"]), ("ksae-eval", [str(root / "mnist-k25-5000-seed3"), "--threads"]),
        ("ksae-train", ["--resume", str(root / "k40")]), ("ksae-eval", [str(root / "k40"), "--threads"]),
        ("ksae-train", ["mnist", "--hidden"]), ("ksae-eval", [str(root / "mnist-k40-5000-seed3"), "--threads"])]
    assert [t.steps for t in left] == [[]] * 4
    text = out.read_text()
    assert line_of(text, "k-Sparse Autoencoder, k = 25", "5000")[6] == "0, 1, 2, 3"  # rewritten after each step
    assert line_of(text, "k-Sparse Autoencoder, k = 40", "5000")[2] == "2.00% ± 0.00"
    children.commands.clear()  # the same command again: nothing left to run
    tables.build(root, out, rows, tables.Settings(seeds=(0, 3)), lambda c, a: c, "script", children)
    assert children.commands == []


def test_run_stops_at_a_failed_command_with_its_status_and_the_tables_so_far(root, tmp_path):
    out = tmp_path / "t.md"
    with pytest.raises(tables.StepFailed) as failed:
        tables.build(root, out, [("err_mnist", "k40")], tables.Settings(), lambda c, a: c, "script",
                     FakeChildren(fail_on="ksae-train"))
    assert failed.value.status == 2 and str(failed.value).endswith("status 2: --k 2000 is not allowed")
    assert line_of(out.read_text(), "k-Sparse Autoencoder, k = 40", "5000")[2] == "stopped at epoch 1200 of 5000"


def test_children_run_a_real_command_and_return_its_status_and_last_lines(tmp_path, capsys):
    handlers = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    try:  # Children passes this process's stop signals on: pytest's own handlers come back after
        children = Children(tmp_path / "logs", pythonpath=REPO)
        status, tail = children.run("eval", "ksae-eval", [tmp_path / "no-such-run"])
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert status == 2 and tail[-1].startswith("error:") and "no-such-run" in tail[-1]
    log = (tmp_path / "logs" / "eval.log").read_text()
    assert "$ ksae-eval " in log and "exit status 2" in log


def test_run_starts_again_a_run_stopped_before_its_first_checkpoint(root, tmp_path):
    folder = root / "mnist-k25-5000-seed4"
    train_run(folder, 25, 5000, seed=4, done=3)
    (folder / "checkpoint.h5").unlink()  # stopped after 3 epochs, before the first checkpoint (every 10)
    children = FakeChildren()
    tables.build(root, tmp_path / "t.md", [("err_mnist", "k25")], tables.Settings(seeds=(4,)), lambda c, a: c,
                 "script", children)
    assert [(c, o[0]) for c, o in children.commands] == [("ksae-train", "mnist"), ("ksae-eval", str(folder))]
    assert children.found == {"mnist-k25-5000-seed4": []}  # its config.json and metrics.jsonl removed first


def test_a_missing_raw_pixel_row_names_the_evaluation_that_makes_it(tmp_path):
    train_run(tmp_path / "k25", 25, 5000, test=0.0188)  # evaluated without --raw-baseline
    text = tables.render(tmp_path, tables.collect(tmp_path), [], lambda c, a: " ".join(map(str, [c, *a])))
    assert line_of(text, "Raw Pixels", "-")[2:8] == ["missing", "", "", "-", "-",
                                                      f"`ksae-eval {tmp_path / 'k25'} --raw-baseline`"]


def test_run_records_a_diverged_run_leaves_it_alone_and_runs_the_other_rows(root, tmp_path):
    out = tmp_path / "t.md"
    children = FakeChildren(fail_on="ksae-train", status=1, message="error: the loss became nan in epoch 1201")
    rows = [("err_mnist", "k40"), ("err_mnist", "k25")]
    tables.build(root, out, rows, tables.Settings(seeds=(0, 5)), lambda c, a: c, "script", children)
    # k40 seed 0 (resumed) diverged, k40 seed 5 and k25 seed 5 (new) diverged too: each tried once, then left
    assert [(c, o[0]) for c, o in children.commands] == [
        ("ksae-train", "--resume"), ("ksae-train", "mnist"), ("ksae-train", "mnist")]
    record = json.loads((root / "k40" / "diverged.json").read_text())
    assert record["message"] == "the loss became nan in epoch 1201"
    assert line_of(out.read_text(), "k-Sparse Autoencoder, k = 40", "5000")[2] == \
        "diverged: the loss became nan in epoch 1201"
    children.commands.clear()  # the same command again: a diverged run is not tried again
    tables.build(root, out, rows, tables.Settings(seeds=(0, 5)), lambda c, a: c, "script", children)
    assert children.commands == []


def test_the_raw_pixel_classifier_is_asked_of_k25s_evaluation_only_while_its_row_is_missing(root, tmp_path):
    def evaluation(where):
        [target] = tables.plan(where, [("err_mnist", "k25")], tables.Settings(ksparse_epochs=1000))
        return target.steps[-1]

    assert evaluation(tmp_path / "empty") == ("ksae-eval", [tmp_path / "empty" / "mnist-k25-1000", "--threads", 1,
                                                            "--raw-baseline"])
    assert evaluation(root) == ("ksae-eval", [root / "mnist-k25-1000", "--threads", 1])  # k25-seed0 has it


def test_a_fine_tuning_on_train_plus_valid_is_its_own_line_whose_command_says_so(root, tmp_path):
    relu = finetune_run(root / "ft-relu", [], test=0.0169, no_pretraining=True)
    wide = finetune_run(root / "ft-relu-60k", [], test=0.0150, no_pretraining=True)
    for folder, rows in ((relu, "train"), (wide, "train+valid")):
        edit_config(folder, finetune=dict(train_on=rows, activations=["relu"], kept=[None]), units="relu")
    placed = {f.state.path.name: f.notes for f in tables.collect(root)}
    assert (placed["ft-relu"], placed["ft-relu-60k"]) == ((), ("fine-tuned on train+valid",))
    text = tables_of(root, tmp_path)
    wide_line, own = noted_and_own_lines(text, ", fine-tuned on train+valid", "200")
    assert wide_line[2] == "1.50%" and "--train-on train+valid" in wide_line[7] and wide_line[8] == "ft-relu-60k"
    assert own[2] == "1.69%" and "--train-on" not in own[7] and own[8] == "ft-relu"


def test_an_in_memory_deep_autoencoder_from_before_upper_layers_had_their_own_start_is_its_own_line(root):
    """ksae-finetune --baseline runs that record no pretrain_layers pretrained layer 2 at sigma 0.01 (it
    learnt only the mean): their command no longer makes them, so they stand apart; today's runs do not."""
    old = finetune_run(root / "ft-deep-inmemory-old", [], phases=("softmax", "top", "all"), test=0.0126,
                       baseline="dropout-ae", layers=2, pretrain_epochs=500)
    new = finetune_run(root / "ft-deep-inmemory-new", [], phases=("softmax", "top", "all"), test=0.0110,
                       baseline="dropout-ae", layers=2, pretrain_epochs=500,
                       pretrain_layers=[{"hidden": 1000, "sigma": 0.01}, {"hidden": 1000, "sigma": 0.1}])
    shallow = finetune_run(root / "ft-shallow-inmemory", [], test=0.0131, baseline="dropout-ae", pretrain_epochs=500)
    placed = {f.state.path.name: (f.key, f.notes) for f in tables.collect(root)}
    assert placed[old.name] == ("deep-dropout-ae", ("layer 2 pretrained at sigma 0.01",))
    assert placed[new.name] == ("deep-dropout-ae", ())
    assert placed[shallow.name][1] == ()  # one layer: nothing above it


def test_a_baseline_fine_tuning_stopped_while_pretraining_is_resumed_not_started_again(root):
    """ksae-finetune --baseline writes its config.json before pretraining its layers, each a run folder
    inside its own; stopped there it has no checkpoint of its own, only its layers': the tables resume it
    (starting it again would clear its config.json and be refused by the layers' folders)."""
    folder = finetune_run(root / "fn-deep-dropout-ae-500-200", [], phases=("softmax", "top", "all"), done=0,
                          baseline="dropout-ae", layers=2, pretrain_epochs=500,
                          pretrain_layers=[{"hidden": 1000, "sigma": 0.01}, {"hidden": 1000, "sigma": 0.1}])
    (folder / "checkpoint.h5").unlink()
    baseline_run(folder / "pretrain-layer1", "dropout-ae", 500, done=120)  # its checkpoint: what a resume goes on from
    state = next(f.state for f in tables.collect(root) if f.state.path == folder)
    assert state.pretraining and state.describe() == "stopped while pretraining its layers"
    target = next(t for t in tables.plan(root, [("fn_mnist", "deep-dropout-ae")], tables.Settings())
                  if t.key == "deep-dropout-ae")
    assert target.folder == folder and target.steps == [("ksae-finetune", ["--resume", folder])]


def test_a_fine_tuning_with_another_momentum_is_its_own_line_not_a_seed_and_its_command_says_so(root, tmp_path):
    source = [ksparse_source(root / "k25-seed0", 5000)]
    rising = finetune_run(root / "ft-ksparse-rising", source, test=0.0150)
    steady = finetune_run(root / "ft-ksparse-steady", source, test=0.0160)
    for folder, settings in ((rising, dict(momentum=0.25, momentum_end=0.9)), (steady, dict(momentum=0.5))):
        edit_config(folder, finetune=settings)
    placed = {f.state.path.name: f.notes for f in tables.collect(root)}
    assert (placed["ft-ksparse"], placed["ft-ksparse-rising"], placed["ft-ksparse-steady"]) == \
        ((), ("momentum 0.25 -> 0.9",), ("momentum 0.5",))
    text = tables_of(root, tmp_path)
    ramp, own = noted_and_own_lines(text, ", momentum 0.25 -> 0.9", "5000 + 200")
    assert own[2] == "1.56%" and own[6] == "0" and "--momentum" not in own[7] and own[8] == "ft-ksparse"
    assert ramp[2] == "1.50%" and "--momentum-end 0.9" in ramp[7] and "--momentum 0.25" not in ramp[7]
    other = line_of(text, own[0] + ", momentum 0.5", "5000 + 200")  # own[0]: the row's label
    assert other[2] == "1.60%" and "--momentum 0.5" in other[7] and other[8] == "ft-ksparse-steady"


def test_a_fine_tuning_with_another_learning_rate_is_its_own_line_and_its_command_says_so(root, tmp_path):
    """ksae-finetune --lr-start / --lr-end other than the paper's 1 -> 0.001 (a deep net with input dropout diverges
    at lr 1): a line of its own whose command gives the rates, not a seed of the paper's row."""
    source = [ksparse_source(root / "k25-seed0", 5000)]
    slower = finetune_run(root / "ft-ksparse-lr025", source, test=0.0140)
    edit_config(slower, finetune=dict(lr_start=0.25, lr_end=0.001))
    placed = {f.state.path.name: f.notes for f in tables.collect(root)}
    assert (placed["ft-ksparse"], placed["ft-ksparse-lr025"]) == ((), ("lr 0.25 -> 0.001",))
    text = tables_of(root, tmp_path)
    other, own = noted_and_own_lines(text, ", lr 0.25 -> 0.001", "5000 + 200")
    assert own[2] == "1.56%" and "--lr-" not in own[7] and own[8] == "ft-ksparse"
    assert other[2] == "1.40%" and "--lr-start 0.25" in other[7] and "--lr-end" not in other[7]
    assert other[8] == "ft-ksparse-lr025"


def test_a_fine_tuning_with_other_dropout_rates_is_its_own_line_and_its_command_says_so(root, tmp_path):
    """ksae-finetune --input-dropout / --hidden-dropout: rates other than the row's own (the dropout AE's 50%
    hidden dropout; none for k-sparse) make a line of their own, whose command gives them; the row's own rates,
    typed out, do not."""
    layer1 = baseline_run(root / "dropout-ae-500", "dropout-ae", 500, test=0.0160)
    source = [{"run_dir": str(layer1), "model": "dropout-ae", "hidden": 1000, "epochs_trained": 500}]
    rates = {"ft-dropout-own": dict(input_dropout=0.0, hidden_dropout=0.5),
             "ft-dropout-input": dict(input_dropout=0.2, hidden_dropout=0.5)}
    for name, settings in rates.items():
        folder = finetune_run(root / name, source, test=0.0133 if name.endswith("own") else 0.0120)
        edit_config(folder, finetune=dict(settings, activations=["sigmoid"], kept=[None]))
    ksparse = finetune_run(root / "ft-ksparse-hidden", [ksparse_source(root / "k25-seed0", 5000)], test=0.0150)
    edit_config(ksparse, finetune=dict(input_dropout=0.0, hidden_dropout=0.5))
    placed = {f.state.path.name: (f.key, f.notes) for f in tables.collect(root)}
    assert placed["ft-dropout-own"] == ("dropout-ae", ())
    assert placed["ft-dropout-input"] == ("dropout-ae", ("input dropout 0.2",))
    assert placed["ft-ksparse-hidden"] == ("ksparse", ("hidden dropout 0.5",))
    text = tables_of(root, tmp_path)
    other, own = noted_and_own_lines(text, ", input dropout 0.2", "500 + 200")
    assert own[2] == "1.33%" and "-dropout " not in own[7] and own[8] == "ft-dropout-own"
    assert other[2] == "1.20%" and "--input-dropout 0.2" in other[7] and "--hidden-dropout" not in other[7]
    ksparse_label = label_ending(text, ", hidden dropout 0.5")
    assert "--hidden-dropout 0.5" in line_of(text, ksparse_label, "5000 + 200")[7]


def test_a_gap_that_rounds_to_zero_reads_plus_zero_and_others_keep_their_sign():
    assert tables._gap([0.0101, 0.0114, 0.0108], 0.0108) == "+0.00"  # mean 1.0767%: -0.0033 points
    assert tables._gap([0.0158], 0.0108) == "+0.50" and tables._gap([0.0160], 0.0180) == "-0.20"


def test_a_rows_own_broken_folder_is_shown_broken_with_no_command_it_would_refuse(root, tmp_path):
    """The denoising row's own folder holds a config.json cut short: every command would refuse that folder,
    so the row says why instead of "missing", and nothing is planned there."""
    folder = root / "mnist-denoising-ae-500"
    folder.mkdir()
    (folder / "config.json").write_text('{"kind": "ksae-base')
    out = tmp_path / "t.md"
    result = paper_tables("--runs-root", str(root), "--out", str(out), cwd=root)
    assert result.returncode == 0, result.output
    line = line_of(out.read_text(), "Denoising Autoencoder (20% input dropout)", "500")
    assert line[2] == "broken: config.json is not JSON (cut short or overwritten)", line
    assert line[7] == "fix or move aside mnist-denoising-ae-500", line
    assert not any("mnist-denoising-ae-500" in l for l in result.stdout.splitlines() if l.startswith("left: "))
    fine_tuning = line_of(out.read_text(), "Denoising AE + F.T. (20% input dropout)", "500 + 200")
    assert fine_tuning[2] == "missing" and fine_tuning[7] == ("waits for mnist-denoising-ae-500 (broken: config.json "
                                                              "is not JSON (cut short or overwritten))"), fine_tuning


class FakePackChildren(FakeChildren):
    """FakeChildren that also does what bin/train-pack does: each --run trained (new) or resumed."""

    def run(self, step, command, options):
        if command != "pack":
            return super().run(step, command, options)
        self.commands.append((command, [str(o) for o in options]))
        options = [str(o) for o in options]
        for spec in [options[i + 1] for i, o in enumerate(options) if o == "--run"]:
            run = dict(part.split("=") for part in spec.split(","))
            folder = Path(run["dir"])
            if "k" in run:
                train_run(folder, int(run["k"]), int(run["epochs"]), seed=int(run["seed"]))
            else:
                config = json.loads((folder / "config.json").read_text())
                _write(folder, config, config["train"]["epochs"])
        return 0, ["done"]


def test_run_trains_the_waiting_k_sparse_rows_in_one_pack_then_evaluates_each(root, tmp_path):
    out, children = tmp_path / "t.md", FakePackChildren()
    rows = [("err_mnist", "k25"), ("err_mnist", "k40")]
    left = tables.build(root, out, rows, tables.Settings(seeds=(0, 3)), lambda c, a: c, "script", children,
                        pack_script="pack")
    assert children.commands[0] == ("pack", [
        "mnist", "--hidden", "1000", "--threads", "1",
        "--run", f"dir={root / 'mnist-k25-5000-seed3'},k=25,seed=3,epochs=5000",
        "--run", f"dir={root / 'k40'}",  # stopped at epoch 1200: resumed as it was asked
        "--run", f"dir={root / 'mnist-k40-5000-seed3'},k=40,seed=3,epochs=5000"])
    assert [(c, o[0]) for c, o in children.commands[1:]] == [
        ("ksae-eval", str(root / "mnist-k25-5000-seed3")), ("ksae-eval", str(root / "k40")),
        ("ksae-eval", str(root / "mnist-k40-5000-seed3"))]
    assert [t.steps for t in left] == [[]] * 4
    assert line_of(out.read_text(), "k-Sparse Autoencoder, k = 40", "5000")[2] == "2.00% ± 0.00"


def test_a_single_waiting_k_sparse_row_is_trained_by_ksae_train_itself(root, tmp_path):
    children = FakePackChildren()
    tables.build(root, tmp_path / "t.md", [("err_mnist", "k40")], tables.Settings(), lambda c, a: c, "script",
                 children, pack_script="pack")
    assert [(c, o[0]) for c, o in children.commands] == [("ksae-train", "--resume"), ("ksae-eval", str(root / "k40"))]


# -- devices, protocols, and rows a clone cannot run again ----------------------------------------------------

def test_a_deep_row_says_which_layer_and_which_phases_ran_on_a_gpu(root, tmp_path):
    layer2 = train_run(root / "k25-layer2", 25, 5000, test=0.02)
    edit_config(layer2, device="gpu:0")
    deep = finetune_run(root / "ft-deep-l2gpu", [ksparse_source(root / "k25-seed0", 5000), ksparse_source(layer2, 5000)],
                        phases=("softmax", "top", "all"), test=0.0111)
    results = json.loads((deep / "finetune.json").read_text())
    results["phase_devices"] = {"softmax": ["gpu:0"], "top": ["gpu:0", "cpu"], "all": ["cpu"]}  # resumed on the CPU
    (deep / "finetune.json").write_text(json.dumps(results))
    placed = {f.state.path.name: f.notes for f in tables.collect(root)}
    assert placed["ft-deep-l2gpu"] == ("layer 2 pretrained on a GPU, fine-tuned partly on a GPU (phases softmax, top)",)
    assert placed["ft-ksparse"] == ()  # CPU throughout: no device in its label


def test_a_table_of_two_evaluation_protocols_is_refused_and_the_old_tables_stay(root, tmp_path):
    out = tmp_path / "tables.md"
    out.write_text("the tables before")
    for name, protocol in (("k25-seed1", 4), ("rbm", 4)):
        report = json.loads((root / name / "eval.json").read_text())
        (root / name / "eval.json").write_text(json.dumps({**report, "protocol": protocol}))
    result = paper_tables("--runs-root", str(root), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 1 and out.read_text() == "the tables before"
    assert_one_line_error(result, "protocol None", "protocol 4", "evaluate them again")
    for name in ("k25-seed0", "k25-seed2", "k25-short"):  # every figure evaluated again: one protocol
        report = json.loads((root / name / "eval.json").read_text())
        (root / name / "eval.json").write_text(json.dumps({**report, "protocol": 4}))
    assert "Every err_mnist figure: ksae-eval's protocol 4." in tables_of(root, tmp_path)


def test_in_a_repository_rows_whose_inputs_are_gone_leave_the_tables_with_why(root, tmp_path):
    (tmp_path / "results" / "checkpoints.json").write_text(json.dumps({"checkpoints": [
        {"path": "results/runs/k25-short/checkpoint.h5", "commit": "0" * 40, "sha256": "0" * 64, "bytes": 1}]}))
    (root / "k25-short" / "checkpoint.h5").unlink()  # kept in history: restorable, so its row stays
    (root / "rbm" / "checkpoint.h5").unlink()  # gone: ksae-eval cannot read it, nor ksae-finetune (ft-rbm)
    outside = train_run(tmp_path.parent / f"{tmp_path.name}-elsewhere", 25, 5000, test=0.02)
    finetune_run(root / "ft-outside", [ksparse_source(outside, 5000)], test=0.0150)
    text = tables_of(root, tmp_path)
    assert line_of(text, "k-Sparse Autoencoder, k = 25", "500")[8] == "k25-short"
    assert "| rbm |" not in text and "ft-rbm |" not in text and "ft-outside |" not in text
    left = text.split("## Left out: commands that cannot run again from a clone")[1]
    assert f"- ft-outside (fn_mnist, ksparse): it reads {outside}, a folder outside the repository" in left
    assert "- rbm (err_mnist, rbm): it reads results/runs/rbm, which holds no checkpoint.h5" in left
    assert "- ft-rbm (fn_mnist, rbm): it reads results/runs/rbm, which holds no checkpoint.h5" in left
