"""A trained run folder opened for what reads it (ksae-eval, ksae-plot, ksae-analyze): its checkpoint,
k and dataset name, and the rows it was trained on."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ksae_cupy.errors import KsaeError


@dataclass
class Run:
    """A trained run folder, opened: its checkpoint, k, H and dataset name."""

    path: Path
    ckpt: object
    k: int
    H: int
    dataset: str
    data_record: dict | None = None  # labels and splits of a user's file (config.json's "data")

    @property
    def params(self) -> dict:
        """The parameters as they act on the dataset's raw rows: a ``--center-input`` run's have the
        training mean folded into ``b`` and ``c`` (:func:`~ksae_cupy.datasets.preprocess.raw_input_params`)."""
        from ksae_cupy.datasets.preprocess import raw_input_params

        return raw_input_params(self.ckpt.params, self.ckpt.preprocess)


def open_run(run_dir) -> Run:
    """Open ``run_dir``: read ``checkpoint.h5`` and the dataset name from ``config.json``.

    The dataset comes from ``config.json`` (the trainer records it there), else from the
    checkpoint's own config. Any problem is a one-line :class:`KsaeError`.
    """
    from ksae_cupy.training.checkpoint import load_checkpoint

    from ksae_cupy.session.runs import RunFolder

    path = Path(run_dir)
    if path.exists() and not path.is_dir():  # a file (a data file, a checkpoint) where a folder is asked for
        raise KsaeError(f"{path} is a file, not a run folder; give the folder that holds checkpoint.h5 and "
                        f"config.json")
    if not path.is_dir():
        raise KsaeError(f"run folder {path} does not exist")
    folder = RunFolder(path)
    folder.check_kind("run folder", "this command reads ksae-train run folders")
    ckpt = load_checkpoint(path / "checkpoint.h5")
    folder.check_checkpoint(ckpt.run_id, ckpt.config)  # this folder's run, not a copy
    dataset, data_record = ckpt.config.get("dataset"), None
    config_path = path / "config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except ValueError:
            raise KsaeError(f"{config_path} is not valid JSON") from None
        dataset, data_record = config.get("dataset", dataset), config.get("data")
    k, H = ckpt.config.get("k"), ckpt.params["W_dh"].shape[1]
    if not isinstance(k, int) or not 1 <= k <= H:
        raise KsaeError(f"{path / 'checkpoint.h5'}: config has no valid k for {H} hidden units ({k!r})")
    return Run(path=path, ckpt=ckpt, k=k, H=H, dataset=dataset, data_record=data_record)


def load_run_dataset(run: Run, data_root=None, log=print, overrides: dict | None = None):
    """The run's dataset with the labels and splits it was trained with, checked against the
    checkpoint's input dimension. ``overrides`` (``labels``, ``test``, ``test_labels``: a
    command's data options) add or replace labels and the test set; the splits stay the run's."""
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.datasets.user_files import DataSpec

    from ksae_cupy.session.trained_on import check_run_data

    if not run.dataset:
        raise KsaeError(f"{run.path}: neither config.json nor the checkpoint names the dataset")
    given = {key for key, value in (overrides or {}).items() if value is not None}
    check_run_data(run.path, given=given)  # the rows the run was trained on, not a file replaced since
    spec = DataSpec.from_record(run.dataset, run.data_record).for_run(**(overrides or {}))
    dataset = load_dataset(spec, data_root, log=log)
    D = run.params["W_dh"].shape[0]
    if dataset.dim != D:
        raise KsaeError(f"dataset {dataset.name} has {dataset.dim} dimensions but the checkpoint's W_dh has {D} rows")
    return dataset


def dataset_split(dataset, split: str):
    """``(X, y)`` of one split of a loaded dataset, or a one-line error when it has none."""
    X, y = getattr(dataset, f"X_{split}"), getattr(dataset, f"y_{split}")
    if X is None:
        raise KsaeError(f"dataset {dataset.name} has no {split} split; use --split valid")
    return X, y
