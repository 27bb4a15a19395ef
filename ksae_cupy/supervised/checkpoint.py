"""Fine-tuning checkpoints: one HDF5 file, written to a temporary name and renamed.

Layout (``format = "ksae-cupy finetune checkpoint"``, ``format_version = 2``):

* root attributes: ``format``, ``format_version``, ``phase_index`` (phases finished),
  ``epoch`` (epochs finished in the current phase), ``step``, ``batch_in_epoch``,
  ``config`` (JSON of :class:`~ksae_cupy.supervised.finetune.FinetuneConfig`), ``run_id``
  (the run folder's identity; absent in older files);
* ``params/`` and ``optim/`` (velocities): ``W1_dh, b1_h, [W2_hh, b2_h,] W_hc, b_c``;
* ``rng/``: attribute ``state`` and, mid-epoch, dataset ``epoch_perm``;
* ``epoch_tally/`` (mid-epoch only; absent in older files): the unfinished epoch's loss sum and batch count
  (:class:`~ksae_cupy.training.epochs.EpochTally`), so that the resumed epoch's line covers all its batches;
* on every group and array, attribute ``sha256`` (:mod:`ksae_cupy.training.checksums`),
  verified on load (version 1 files, written before checksums, load with a one-line note).

Written with :func:`ksae_cupy.training.checkpoint.write_hdf5_atomically` (``<name>.tmp``, reopened
to verify, renamed); a missing, foreign or damaged file is a one-line :class:`KsaeError`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ksae_cupy.training.checkpoint import read_hdf5_checked, write_hdf5_atomically
from ksae_cupy.errors import KsaeError

FORMAT = "ksae-cupy finetune checkpoint"
FORMAT_VERSION = 2  # 2: checksums; 1 is still read, without them
UNSEALED_VERSIONS = (1,)
_COUNTERS = ("phase_index", "epoch", "step", "batch_in_epoch")


def save_finetune_checkpoint(path: Path, state: dict) -> None:
    """Write a :meth:`FinetuneTrainer.state` dict to ``path`` atomically."""

    def write(f) -> None:
        f.attrs["format"] = FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        for name in _COUNTERS:
            f.attrs[name] = int(state[name])
        f.attrs["config"] = json.dumps(state["config"], sort_keys=True)
        if state.get("run_id") is not None:
            f.attrs["run_id"] = str(state["run_id"])
        groups = [("params", state["params"]), ("optim", state["velocities"])]
        if state["batch_in_epoch"] and state.get("epoch_tally") is not None:
            groups.append(("epoch_tally", state["epoch_tally"]))
        for group, arrays in groups:
            g = f.create_group(group)
            for name, value in arrays.items():
                g.create_dataset(name, data=np.asarray(value))
        rng = f.create_group("rng")
        rng.attrs["state"] = json.dumps(state["rng_state"])
        if state["epoch_perm"] is not None:
            rng.create_dataset("epoch_perm", data=np.asarray(state["epoch_perm"]))

    write_hdf5_atomically(path, write, load_finetune_checkpoint)


def load_finetune_checkpoint(path: Path) -> dict:
    """Read and check a fine-tuning checkpoint; returns the state dict."""
    path = Path(path)

    def read(f) -> dict:
        state = {name: int(f.attrs[name]) for name in _COUNTERS}
        state["config"] = json.loads(f.attrs["config"])
        run_id = f.attrs.get("run_id")
        state["run_id"] = run_id.decode() if isinstance(run_id, bytes) else run_id
        state["params"] = {k: f["params"][k][()] for k in f["params"]}
        state["velocities"] = {k: f["optim"][k][()] for k in f["optim"]}
        state["rng_state"] = json.loads(f["rng"].attrs["state"])
        state["epoch_perm"] = f["rng"]["epoch_perm"][()] if "epoch_perm" in f["rng"] else None
        state["epoch_tally"] = {k: f["epoch_tally"][k][()] for k in f["epoch_tally"]} if "epoch_tally" in f else None
        return state

    state = read_hdf5_checked(path, "fine-tuning checkpoint", FORMAT, FORMAT_VERSION, read, UNSEALED_VERSIONS)
    for name, value in state["params"].items():
        v = state["velocities"].get(name)
        if v is None or v.shape != value.shape or v.dtype != value.dtype:
            raise KsaeError(f"{path}: optim/{name} is missing or does not match params/{name}")
    return state
