"""The dead-units table (beyond the paper: the AuxK and centred-input runs beside the paper's recipe):
one row per ksae-train run folder.

For each RUN_DIR: its options beyond the paper (config.json), the last epoch's dead fractions and losses
(metrics.jsonl), the units the final model keeps for no training example (its top k of every training row,
computed here), and the test error of ``ksae-eval`` (eval.json, when it has run).

    KSAE_DATA_DIR=/root/data bin/dead-units-table /root/runs/dead-k25-*-500
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ksae_cupy.reports.folders import read_json, read_metrics
from ksae_cupy.reports.markdown import percent


COLUMNS = 9  # the cells of a row


def check_readable(run_dir: Path) -> None:
    """One ``error:`` line (status 2) for a folder it cannot read at all, before any row is printed."""
    from ksae_cupy.errors import KsaeError

    if not run_dir.exists():
        raise KsaeError(f"RUN_DIR {run_dir} does not exist")
    if not run_dir.is_dir():
        raise KsaeError(f"RUN_DIR {run_dir} is a file, not a run folder")
    if not (run_dir / "config.json").is_file():
        raise KsaeError(f"RUN_DIR {run_dir} holds no config.json: not a run folder (give ksae-train run folders)")


def row(run_dir: Path) -> str:
    """The table row of ``run_dir``: its dead units, or for a folder of another kind, a broken one or one not
    yet trained, a row that says so (the table goes on with the others)."""
    from ksae_cupy.errors import KsaeError
    from ksae_cupy.reports.folders import broken_reason
    from ksae_cupy.session.runs import TRAIN, config_kind

    broken = broken_reason(run_dir)
    config = read_json(run_dir / "config.json")
    kind = None if broken else config_kind(config)
    if broken or kind != TRAIN:
        why = f"broken: {broken}" if broken else f"a {kind} run: no k-sparse units to count (give ksae-train runs)"
        return note_row(why, run_dir)
    metrics = read_metrics(run_dir)
    if not metrics or not (run_dir / "checkpoint.h5").is_file():
        return note_row("not trained yet: no epoch logged or no checkpoint.h5", run_dir)
    try:
        return counted_row(run_dir, config, metrics)
    except KsaeError as exc:  # a checkpoint cut short, data that is not there: this row says so
        from ksae_cupy.errors import one_line

        return note_row(f"broken: {one_line(exc)}", run_dir)


def note_row(text: str, run_dir: Path) -> str:
    return "| " + " | ".join([text.replace("|", "/")] + ["-"] * (COLUMNS - 2) + [f"`{run_dir.name}`"]) + " |"


def counted_row(run_dir: Path, config: dict, metrics: list) -> str:
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.datasets.user_files import DataSpec
    from ksae_cupy.training.estimator import KSparseAutoencoder

    from ksae_cupy.session.trained_on import check_run_data

    train = config["train"]
    last = metrics[-1]
    check_run_data(run_dir, config)  # the data the run recorded, not a file replaced since (a broken row if so)
    model = KSparseAutoencoder.load(run_dir / "checkpoint.h5", device="cpu")
    X_train = load_dataset(DataSpec.from_record(config["dataset"], config.get("data"))).X_train
    kept_h = np.zeros(train["hidden"], dtype=bool)
    for start in range(0, len(X_train), 5000):
        kept_h |= (model.transform(X_train[start:start + 5000]) != 0).any(axis=0)
    variant = ", ".join(part for part in (f"aux_k {train['aux_k']}" if train.get("aux_k") else "",
                                          "centred" if train.get("center_input") else "") if part) or "the paper's"
    window = last.get("dead_window_fraction")
    valid = last.get("valid_loss")
    evaluation = read_json(run_dir / "eval.json")
    test = "-" if evaluation is None else percent(evaluation["features"]["test_error"])
    return (f"| {variant} | {last['epoch']} | {100 * last['dead_fraction']:.1f}% | "
            f"{'-' if window is None else f'{100 * window:.1f}%'} | {100 * (1 - kept_h.mean()):.1f}% | "
            f"{last['train_loss']:.4f} | {'-' if valid is None else f'{valid:.4f}'} | {test} | `{run_dir.name}` |")


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="dead-units-table", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="ksae-train run folders")
    args = parser.parse_args()
    for run_dir in args.run_dirs:  # every folder checked before the table starts
        check_readable(run_dir)
    print("| variant | epochs | dead in the last epoch | dead over the last 10,000 examples | never kept by the final "
          "model (training set) | training loss | validation loss | test error | run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run_dir in args.run_dirs:
        print(row(run_dir), flush=True)
    return 0
