"""What a run was trained on, checked: what a command reads from a run is what the run was trained on.

Four records, each checked by every command that reads it:

* **The data file.** A run on a user's file records the file's SHA-256 in config.json
  (``dataset_sha256``, :func:`~ksae_cupy.session.runs.dataset_record`). :func:`check_run_data`
  refuses to read the file when its bytes changed since (ksae-eval, ksae-analyze, ksae-plot,
  ksae-data codes, ksae-finetune; ``--resume`` has its own check in
  :mod:`ksae_cupy.session.resuming`). A built-in dataset is recorded by its name only: its files
  are checked against their published checksums by ``ksae-data fetch`` and ``ksae-data verify``.
* **Its other files.** The ``--labels``, ``--test`` and ``--test-labels`` files of a run on a user's
  data are hashed beside their paths in config.json's ``data`` (``labels_sha256``, ...,
  :func:`data_files_record`) and checked with the data file (:func:`check_data_files`), and on
  ``--resume``; a command given one of these options reads that file instead, unchecked.
* **Where codes came from.** ``ksae-data codes RUN OUT.npy`` writes ``OUT.json`` beside the codes
  (:func:`write_codes_origin`): the codes' SHA-256, and layer 1's folder, run id, epoch and
  checkpoint SHA-256. A run trained on OUT.npy (layer 2) copies that origin into its config.json
  as ``codes_origin`` (:func:`codes_origin`); a codes file whose bytes are no longer those
  ``OUT.json`` names is refused.
* **The chain of a deep network.** ``ksae-finetune LAYER1 LAYER2`` compares LAYER2's
  ``codes_origin`` with LAYER1 as it is now (:func:`check_chain`): another run's layer, or a layer 1
  resumed or changed after its codes were written, is refused, and so is a fine-tuning --alpha other
  than the one the codes were written with (:func:`check_codes_alpha`). Folders written before these
  records existed get a one-line note that the chain cannot be verified, and are read as before.

Hashes are shown by their first 12 hex digits.
"""
from __future__ import annotations

import json
from pathlib import Path

from ksae_cupy.errors import KsaeError, note
from ksae_cupy.paths import file_sha256

SHORT = 12  # hex digits of a SHA-256 shown in messages
CODES_WRITER = "ksae-data codes"


def short(digest: str | None) -> str:
    return (digest or "?")[:SHORT]


def data_file(dataset: str) -> Path:
    """The file of a user dataset as config.json records it (an HDF5 file's ``:member`` dropped)."""
    return Path(dataset.rsplit(":", 1)[0] if ".h5:" in dataset or ".hdf5:" in dataset else dataset)


# -- the data file ---------------------------------------------------------------------------------
def check_data(dataset: str | None, expected: str | None, run_dir) -> None:
    """Refuse ``dataset`` (as config.json records it) when its bytes are not the run's (SHA-256
    ``expected``). Nothing is checked without a recorded hash (a built-in dataset, an old folder)
    or without the file (the loader then says it is missing)."""
    if not dataset or not expected:
        return
    path = data_file(dataset)
    refuse_if_changed(path, expected, f"{run_dir}: its data file {path} changed since the run was trained on it",
                      f"put the run's data back at {path}, or train a new run on the new file")


def refuse_if_changed(path: Path, expected: str, what: str, advice: str) -> None:
    """One line naming both hashes and what to do, when the file at ``path`` is there and its SHA-256 is not
    ``expected`` (a missing file is the loader's to name)."""
    if not path.is_file():
        return
    found = file_sha256(path)
    if found != expected:
        raise KsaeError(f"{what} (SHA-256 now {short(found)}, the run recorded {short(expected)}); {advice}")


def check_run_data(run_dir, config: dict | None = None, given=()) -> None:
    """:func:`check_data` and :func:`check_data_files` of the run folder ``run_dir`` (its config.json, unless
    given); ``given``: the data options the command gave, whose files replace the run's."""
    if config is None:
        try:
            config = json.loads((Path(run_dir) / "config.json").read_text())
        except (OSError, ValueError):
            return  # the command's own reading of config.json says what is wrong with it
    if isinstance(config, dict):
        check_data(config.get("dataset"), config.get("dataset_sha256"), run_dir)
        check_data_files(config.get("data"), run_dir, given)


# -- the other files of a user's data --------------------------------------------------------------
DATA_FILES = {"labels": "--labels", "test": "--test", "test_labels": "--test-labels"}  # config.json's key: option


def data_files_record(data: dict) -> dict:
    """config.json's ``data`` (:meth:`~ksae_cupy.datasets.user_files.DataSpec.record`) with the SHA-256 of each
    file it names beside it (``labels_sha256``, ``test_sha256``, ``test_labels_sha256``)."""
    from ksae_cupy.datasets.user_files import split_member

    record = dict(data)
    for key in DATA_FILES:
        path = split_member(data[key])[0] if data.get(key) else None
        if path is not None and path.is_file():
            record[f"{key}_sha256"] = file_sha256(path)
    return record


def check_data_files(data: dict | None, run_dir, given=()) -> None:
    """Refuse a ``--labels``, ``--test`` or ``--test-labels`` file of the run (config.json's ``data``) whose bytes
    are not those recorded. Not checked: one the command replaces (``given``: its data options; a new --test
    brings its own labels), one recorded without a hash (an older folder), one missing (the loader says so)."""
    from ksae_cupy.datasets.user_files import split_member

    if not isinstance(data, dict):
        return
    replaced = set(given) | ({"test_labels"} if "test" in given else set())
    for key, option in DATA_FILES.items():
        expected = data.get(f"{key}_sha256")
        if key in replaced or not data.get(key) or not expected:
            continue
        path = split_member(data[key])[0]
        refuse_if_changed(path, expected, f"{run_dir}: its {option} file {path} changed since the run was trained",
                          f"put the run's file back at {path}, or give {option} {path} to a command that takes it "
                          f"to read it as it is now")


# -- codes and their origin ------------------------------------------------------------------------
def origin_file(codes_path) -> Path:
    """``OUT.json`` beside ``OUT.npy``: where a codes file's origin is recorded."""
    return Path(codes_path).with_suffix(".json")


def layer_record(run_dir, run_id: str | None, epoch: int, step: int | None) -> dict:
    """What identifies a pretrained layer as it is now: folder, run id, epoch, step, checkpoint SHA-256."""
    path = Path(run_dir).resolve()
    return {"run_dir": str(path), "run_id": run_id, "epoch": epoch, "step": step,
            "checkpoint_sha256": file_sha256(path / "checkpoint.h5")}


def write_codes_origin(codes_path, layer: dict, info: dict) -> dict:
    """Write ``OUT.json`` (atomically) for the codes just written to ``codes_path``: ``info`` (what
    write_codes returns), the codes' SHA-256 and ``layer`` (:func:`layer_record`). Returns it."""
    from ksae_cupy.atomic import write_json_atomic
    record = {**info, "written_by": CODES_WRITER, "codes_sha256": file_sha256(Path(codes_path)), "layer": layer}
    write_json_atomic(origin_file(codes_path), record)
    return record


def codes_origin(path: Path, sha256: str) -> dict | None:
    """config.json's ``codes_origin`` of a run on the file ``path`` (of bytes ``sha256``): the layer its
    codes came from, when ``ksae-data codes`` wrote it; None for any other file. A codes file whose
    bytes are not those its ``OUT.json`` names was replaced after it was written: refused."""
    sidecar = origin_file(path)
    if not sidecar.exists():
        return None
    try:
        record = json.loads(sidecar.read_text())
    except (OSError, ValueError) as exc:
        record = exc
    if not isinstance(record, dict):  # there, but not a record: said now, not found out at ksae-finetune
        why = record.strerror if isinstance(record, OSError) and record.strerror else (
            "not JSON" if isinstance(record, ValueError) else "not a JSON object")
        note(f"{sidecar}, beside the data file {path}, cannot be read as the codes' origin ({why}); this run records "
             f"no origin, so ksae-finetune cannot verify which layer 1 its codes came from; write the codes again "
             f"with {CODES_WRITER} LAYER1_RUN {path} to record it")
        return None
    if record.get("written_by") != CODES_WRITER or not record.get("codes_sha256"):
        return None  # not ours (bin/reproduce-finetune wrote an info file there before origins were recorded)
    if record["codes_sha256"] != sha256:
        raise KsaeError(f"{path} changed since {CODES_WRITER} wrote it (SHA-256 now {short(sha256)}, {sidecar} "
                        f"records {short(record['codes_sha256'])}); write the codes again with {CODES_WRITER} "
                        f"{record.get('layer', {}).get('run_dir', 'LAYER1_RUN')} {path}, or delete {sidecar} if "
                        f"the file is data of its own")
    return {"codes_sha256": sha256, "alpha": record.get("alpha"), "layer": record.get("layer")}


# -- the chain of a deep network -------------------------------------------------------------------
def check_chain(layer1_dir, layer1_run_id: str | None, layer1_epoch: int, layer2_dir, layer2_config: dict) -> None:
    """Refuse a layer 2 that was not trained on the codes of layer 1 as it is now; a layer 2 that does
    not record its codes' origin gets a one-line note (the chain cannot be verified) and is used."""
    origin = layer2_config.get("codes_origin")
    layer = origin.get("layer") if isinstance(origin, dict) else None
    if not isinstance(layer, dict) or not layer.get("checkpoint_sha256"):
        note(f"the chain {layer1_dir} -> {layer2_dir} cannot be verified: {layer2_dir}/config.json does not record "
             f"which layer-1 checkpoint its codes came from (trained before {CODES_WRITER} recorded it, or on a "
             f"file {CODES_WRITER} did not write); going on")
        return
    retrain = (f"write {layer1_dir}'s codes again ({CODES_WRITER} {layer1_dir} OUT.npy) and train layer 2 on them, "
               f"or pass the layer 1 that {layer2_dir} was trained on")
    if layer.get("run_id") and layer1_run_id and layer["run_id"] != layer1_run_id:
        raise KsaeError(f"layer 2 {layer2_dir} was trained on the codes of another run ({layer.get('run_dir')}, run "
                        f"{layer['run_id']}), not of layer 1 {layer1_dir} (run {layer1_run_id}); {retrain}")
    found = file_sha256(Path(layer1_dir) / "checkpoint.h5")
    if found == layer["checkpoint_sha256"]:
        return
    if layer.get("epoch") is not None and layer["epoch"] != layer1_epoch:
        what = (f"layer 1 {layer1_dir} is now at epoch {layer1_epoch}, but layer 2 {layer2_dir} was trained on its "
                f"codes of epoch {layer['epoch']} (checkpoint SHA-256 now {short(found)}, then "
                f"{short(layer['checkpoint_sha256'])}): layer 1 was "
                + ("resumed after its codes were written" if layer1_epoch > layer["epoch"] else
                   "given another checkpoint after its codes were written"))
    else:
        what = (f"layer 1 {layer1_dir}'s checkpoint changed since the codes layer 2 {layer2_dir} was trained on were "
                f"written (SHA-256 now {short(found)}, then {short(layer['checkpoint_sha256'])})")
    raise KsaeError(f"{what}; {retrain}")


def check_codes_alpha(alpha: float | None, pretrained, layer2_config: dict) -> None:
    """Refuse fine-tuning at an ``alpha`` other than the one layer 2's codes were written with (its config.json's
    ``codes_origin``): layer 1 would feed layer 2 alpha*k units of another count than it was trained on. A layer 2
    that does not record it is left to :func:`~ksae_cupy.session.trained_on.check_chain`'s note."""
    origin = layer2_config.get("codes_origin")
    made_with = origin.get("alpha") if isinstance(origin, dict) else None
    if alpha is None or not isinstance(made_with, (int, float)) or float(made_with) == float(alpha):
        return
    raise KsaeError(f"--alpha {alpha:g} differs from the alpha layer 2 {pretrained[1]} was trained with: its codes "
                    f"were written with ksae-data codes --alpha {made_with:g} from {pretrained[0]}; give --alpha "
                    f"{made_with:g}, or write the codes again with --alpha {alpha:g} and train layer 2 on them")
