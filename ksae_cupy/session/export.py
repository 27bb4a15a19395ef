"""A model's weights in the formats other tools read: safetensors, NumPy ``.npz``, a PyTorch state dict.

    export(model_or_path, "model.safetensors")        # format from the suffix, or format="npz" / "torch"
    tensors, metadata = read_export("model.safetensors")

The layout (docs/guide/export.md), that of two ``torch.nn.Linear`` layers, in the model's dtype:

    encoder.weight   H x D   W_dh^T          (nn.Linear(D, H): z = x W + b)
    encoder.bias     H       b_h
    decoder.weight   D x H   W_dh            (tied: the encoder's transpose; nn.Linear(H, D))
    decoder.bias     D       c_d
    preprocess.NAME          the dataset's preprocessing statistics, when the run has any (ZCA, std, ...)

    input.mean       D       the training mean a --center-input model subtracts (zeros otherwise)
    units.firing_count  H    how many training rows kept each unit in their k-code (when the source records it)
    units.dead       H       1 where that count is 0: dead units, as every command counts them (uint8)

A ``--center-input`` model's training mean is folded into the biases (as ``ksae-eval`` reads it:
:func:`~ksae_cupy.datasets.preprocess.raw_input_params`), so the layers act on the rows as the
dataset gives them; ``input.mean`` says what was folded. The metadata (:func:`export_metadata`) says ``k``,
``alpha`` (by :mod:`ksae_cupy.training.chosen_alpha`'s rule unless given) and where it came from, ``alpha_k``,
``activation``, ``input_scale`` (what the dataset multiplied the raw inputs by: 1/255 for MNIST's pixels) and
what made the model. Codes: keep each row's ``k`` (reconstruction) or ``alpha_k`` (features) largest values
of ``encoder(x)``, zero the rest (ReLU models: and the negative ones).

``layout="saelens"`` or ``"sparsify"`` writes a folder the field's libraries load instead
(:mod:`ksae_cupy.session.export_layouts`): SAELens' ``sae_weights.safetensors`` (``W_enc`` D x H, ``b_enc``,
``W_dec`` H x D, ``b_dec``) or sparsify's ``sae.safetensors``, each with its ``cfg.json``; the tensors above
that are not a layer's (``input.mean``, ``units.*``, ``preprocess.*``) lie beside them in ``ksae_cupy.safetensors``
(the libraries load their file strictly), under the same names, with the metadata.

safetensors is written here with NumPy and JSON (8-byte little-endian header length, a JSON header
of dtype, shape and byte offsets per tensor and a ``__metadata__`` map of strings, then the raw
little-endian bytes): no dependency. ``.npz`` holds the same names and the metadata as JSON text under
``__metadata__``; the PyTorch file (``torch.save`` of a dict of tensors, the same names, and the
metadata's JSON under ``__metadata__``) needs PyTorch, and only that format does.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError, OptionError, literal

FORMATS = {"safetensors": (".safetensors",), "npz": (".npz",), "torch": (".pt", ".pth")}
EXPORT_FORMAT = "ksae-cupy export"
EXPORT_VERSION = 1
METADATA_KEY = "__metadata__"
LAYOUTS = ("linear", "saelens", "sparsify")  # two nn.Linear layers; the field's libraries' folders
# safetensors' dtype names (its format's specification)
SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64", "int32": "I32",
                      "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def format_of(path, fmt: str | None = None) -> str:
    """The export format: ``fmt`` as given, else the one ``path``'s suffix names. A suffix of another format
    (``model.npz`` with ``fmt="torch"``) is refused: the file's name would lie about its content."""
    suffix = Path(path).suffix.lower()
    by_suffix = next((name for name, suffixes in FORMATS.items() if suffix in suffixes), None)
    if fmt is None:
        if by_suffix is None:
            raise OptionError("format", f"cannot tell the format of {literal(str(path))} from its suffix; give "
                                        f"{{name}} {'|'.join(FORMATS)}, or name the file .safetensors, .npz or .pt")
        return by_suffix
    if fmt not in FORMATS:
        raise OptionError("format", f"{{name}} {literal(repr(fmt))} is not allowed; use one of {', '.join(FORMATS)}")
    if by_suffix is not None and by_suffix != fmt:
        raise OptionError("format", f"{{name}} {fmt} does not match the file name {literal(str(path))} (its suffix says "
                                    f"{by_suffix}); name it {FORMATS[fmt][0]} or drop {{name}}")
    return fmt


def require_torch():
    """The ``torch`` module, or one line saying what to do without it."""
    try:
        import torch
    except ImportError:
        raise OptionError("format", "{name} torch needs PyTorch, which is not installed (pip install torch); "
                                    "{name} safetensors or npz need nothing, and PyTorch reads both") from None
    return torch


def default_path(source, fmt: str | None = None, layout: str = "linear") -> Path:
    """Where :func:`export` writes when given no path: in the current folder, named after the run (or the
    checkpoint file, or ``model`` for an estimator in memory): ``RUN.safetensors`` (or ``.npz``, ``.pt``), or a
    folder ``RUN-saelens`` / ``RUN-sparsify``."""
    from ksae_cupy.training.estimator import KSparseAutoencoder

    if isinstance(source, KSparseAutoencoder):
        stem = "model"
    else:
        source = Path(source)
        stem = source.name if source.is_dir() else (source.parent.name if source.name == "checkpoint.h5"
                                                    and source.parent.name else source.stem)
    if layout != "linear":
        return Path(f"{stem}-{layout}")
    return Path(stem + FORMATS[fmt or "safetensors"][0])


def export(source, path=None, format: str | None = None, alpha: float | None = None,  # noqa: A002 (the CLI's word)
           layout: str = "linear") -> dict:
    """Write the model ``source`` to ``path`` in ``format`` (default: from the suffix); returns the metadata.

    ``source`` is a fitted :class:`~ksae_cupy.training.estimator.KSparseAutoencoder`, a ``ksae-train`` run
    folder or a checkpoint file (one ``save`` wrote, or a run's ``checkpoint.h5``). ``alpha`` (features keep
    ``alpha*k`` units) defaults by the package's one rule (:mod:`ksae_cupy.training.chosen_alpha`): the
    estimator's ``alpha``, else the run's evaluated choice, else 3. ``path`` defaults to :func:`default_path`.
    ``layout``: one of :data:`LAYOUTS` (``saelens`` and ``sparsify`` write a folder: ``path`` names it).
    The file is written whole or not at all (a temporary name, then a rename)."""
    from ksae_cupy.model import alpha_k

    if layout not in LAYOUTS:
        raise OptionError("layout", f"{{name}} {literal(repr(layout))} is not allowed; use one of {', '.join(LAYOUTS)}")
    if layout != "linear" and format not in (None, "safetensors"):
        raise OptionError("format", f"{{name}} {format} does not go with layout {layout}, whose folder holds "
                                    f"safetensors; leave it out")
    path = default_path(source, format, layout) if path is None else Path(path)
    fmt = "safetensors" if layout != "linear" else format_of(path, format)
    torch = require_torch() if fmt == "torch" else None
    from ksae_cupy.paths import check_output_file

    if layout == "linear":
        check_output_file(path, "export file")
    model = _model_of(source, alpha)
    D, H = model["W_dh"].shape
    alpha_k(model["config"]["k"], model["alpha"], H)  # an alpha*k above H: refused before anything is written
    tensors = export_tensors(model)
    metadata = export_metadata(model)
    if layout != "linear":
        from ksae_cupy.session.export_layouts import write_layout

        write_layout(layout, path, tensors, metadata, {key: _text(key, value) for key, value in metadata.items()},
                     safetensors_bytes)
        return metadata
    tmp = path.with_name(path.name + ".tmp")
    try:
        if fmt == "safetensors":
            tmp.write_bytes(safetensors_bytes(tensors, {key: _text(key, value) for key, value in metadata.items()}))
        elif fmt == "npz":
            with open(tmp, "wb") as f:  # a file object: np.savez would add .npz to a name
                np.savez(f, **tensors, **{METADATA_KEY: np.array(json.dumps(metadata, sort_keys=True))})
        else:
            state = {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in tensors.items()}
            torch.save({**state, METADATA_KEY: json.dumps(metadata, sort_keys=True)}, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return metadata


def _model_of(source, alpha: float | None) -> dict:
    """Host arrays and records of ``source`` (an estimator, a run folder or a checkpoint file)."""
    from ksae_cupy.backend import to_host
    from ksae_cupy.training.checkpoint import load_checkpoint

    from ksae_cupy.training.estimator import KSparseAutoencoder

    from ksae_cupy.training.chosen_alpha import dataset_input_scale, default_alpha, run_folder_of
    from ksae_cupy.training.unit_counts import read_unit_counts

    input_scale, counts = None, None
    if isinstance(source, KSparseAutoencoder):
        source.params_  # noqa: B018 (not fitted: scikit-learn's NotFittedError, in its words)
        ckpt = source.trainer_.checkpoint(source.preprocess_)
        ckpt.run_id = source.__dict__.get("run_id_")
        where = "an estimator in memory"
        alpha, alpha_from = (source.alpha_, "the estimator's alpha") if alpha is None else (alpha, "given")
        counts = source.__dict__.get("unit_counts_")
        input_scale = source.input_scale
    else:
        where = Path(source)
        ckpt = load_checkpoint(_checkpoint_path(where))
        if where.is_dir():
            from ksae_cupy.session.runs import RunFolder

            RunFolder(where).check_checkpoint(ckpt.run_id, ckpt.config)  # this folder's run, not a copy
        run_dir = run_folder_of(where)
        if alpha is None:
            alpha, alpha_from = default_alpha(int(ckpt.config["k"]), int(ckpt.params["W_dh"].shape[1]), run_dir,
                                              ckpt.epoch)
        else:
            alpha_from = "given"
        if run_dir is not None:
            counts = read_unit_counts(run_dir, ckpt.step)
            input_scale = dataset_input_scale(run_dir)
    from ksae_cupy.datasets.preprocess import INPUT_MEAN, raw_input_params

    params = {name: to_host(value) for name, value in raw_input_params(ckpt.params, ckpt.preprocess).items()}
    mean_d = (ckpt.preprocess or {}).get(INPUT_MEAN)
    D = params["W_dh"].shape[0]
    return {**params, "config": ckpt.config, "alpha": float(alpha), "alpha_from": alpha_from, "epoch": ckpt.epoch,
            "step": ckpt.step, "run_id": ckpt.run_id, "source": str(where), "trained_by": ckpt.provenance,
            "centred": mean_d is not None, "input_scale": input_scale,
            "input_mean": np.zeros(D, params["W_dh"].dtype) if mean_d is None else np.asarray(to_host(mean_d)),
            "unit_counts": counts,
            "preprocess": {name: np.asarray(value) for name, value in (ckpt.preprocess or {}).items()
                           if name != INPUT_MEAN}}


def _checkpoint_path(source: Path) -> Path:
    """The checkpoint of ``source``: a run folder's ``checkpoint.h5`` (a ksae-train folder only), or the file."""
    if source.is_dir():
        from ksae_cupy.session.runs import RunFolder

        folder = RunFolder(source)
        folder.check_kind("export", "export reads the autoencoders of ksae-train run folders")
        if not folder.checkpoint.is_file():
            raise KsaeError(f"run folder {source} holds no checkpoint.h5; train it first (ksae-train)")
        return folder.checkpoint
    if not source.exists():
        raise KsaeError(f"{source} does not exist; give a ksae-train run folder or a checkpoint file")
    return source


def export_tensors(model: dict) -> dict:
    """The layout's tensors (host arrays, C order) of a model :func:`_model_of` read."""
    W_dh = np.asarray(model["W_dh"])
    tensors = {"encoder.weight": np.ascontiguousarray(W_dh.T), "encoder.bias": np.asarray(model["b_h"]),
               "decoder.weight": np.ascontiguousarray(W_dh), "decoder.bias": np.asarray(model["c_d"])}
    tensors["input.mean"] = np.asarray(model["input_mean"], dtype=W_dh.dtype)
    counts = model.get("unit_counts")
    if counts is not None:
        tensors["units.firing_count"] = np.asarray(counts["firing_counts"], dtype=np.int64)
        tensors["units.dead"] = (tensors["units.firing_count"] == 0).astype(np.uint8)
    tensors.update({f"preprocess.{name}": value for name, value in sorted(model["preprocess"].items())})
    return tensors


def export_metadata(model: dict) -> dict:
    """What the tensors need to be used (k, alpha, activation) and where they come from."""
    from ksae_cupy.model import alpha_k
    from ksae_cupy.made_with import provenance

    config = model["config"]
    D, H = np.asarray(model["W_dh"]).shape
    return {
        "format": EXPORT_FORMAT, "format_version": EXPORT_VERSION,
        "k": int(config["k"]), "alpha": model["alpha"], "alpha_k": alpha_k(int(config["k"]), model["alpha"], H),
        "activation": config.get("activation", "linear"), "topk": config.get("topk", "sort"),
        "n_inputs": int(D), "n_hidden": int(H), "dtype": str(np.asarray(model["W_dh"]).dtype), "tied": True,
        "input_mean_folded": bool(model["centred"]), "preprocess": sorted(model["preprocess"]),
        "alpha_from": model.get("alpha_from"), "input_scale": model.get("input_scale"),
        "n_dead": None if model.get("unit_counts") is None else int(np.sum(np.asarray(
            model["unit_counts"]["firing_counts"]) == 0)),
        "dead_definition": None if model.get("unit_counts") is None else model["unit_counts"]["definition"],
        "firing_rows": None if model.get("unit_counts") is None else int(model["unit_counts"]["rows"]),
        "epoch": int(model["epoch"]), "step": int(model["step"]), "run_id": model["run_id"],
        "source": model["source"], "trained_by": model["trained_by"], "exported_by": provenance(),
    }


# The metadata's fields that are text: safetensors' string map holds them as they are, every other field as JSON.
TEXT_FIELDS = ("format", "activation", "topk", "dtype", "run_id", "source", "alpha_from", "dead_definition")


def _text(key: str, value) -> str:
    """A metadata field as safetensors' string map holds it (:data:`TEXT_FIELDS` as they are; None as ``null``)."""
    return value if key in TEXT_FIELDS and isinstance(value, str) else json.dumps(value, sort_keys=True)


def safetensors_bytes(tensors: dict, metadata: dict[str, str]) -> bytes:
    """The bytes of a safetensors file holding ``tensors`` (name -> NumPy array) and ``metadata``."""
    header, chunks, offset = {METADATA_KEY: metadata}, [], 0
    for name, value in tensors.items():
        array = np.asarray(value)
        if array.dtype.name not in SAFETENSORS_DTYPES:
            raise KsaeError(f"tensor {name} has dtype {array.dtype}, which safetensors does not hold")
        data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[array.dtype.name], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors' own writer pads it
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def read_safetensors(path) -> tuple[dict, dict]:
    """``(tensors, metadata)`` of a safetensors file: NumPy arrays by name, and the string map."""
    blob = Path(path).read_bytes()
    if len(blob) < 8:
        raise KsaeError(f"{path} is not a safetensors file (shorter than its header length)")
    (size,) = struct.unpack("<Q", blob[:8])
    try:
        header = json.loads(blob[8:8 + size])
    except ValueError:
        raise KsaeError(f"{path} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise KsaeError(f"{path} is not a safetensors file (its header is not a JSON object)")
    metadata = header.pop(METADATA_KEY, {}) or {}
    by_code = {code: np.dtype(name).newbyteorder("<") for name, code in SAFETENSORS_DTYPES.items()}
    data_bytes = len(blob) - 8 - size
    tensors = {}
    for name, entry in header.items():
        # each tensor's bytes stay inside the file's data section, and are as many as its shape and dtype ask
        try:
            start, end = (int(offset) for offset in entry["data_offsets"])
            dtype, shape = by_code[entry["dtype"]], tuple(int(n) for n in entry["shape"])
        except (KeyError, TypeError, ValueError):
            raise KsaeError(f"{path}: tensor {name!r} has no valid dtype, shape and data_offsets") from None
        if not 0 <= start <= end <= data_bytes or end - start != dtype.itemsize * int(np.prod(shape, dtype=np.int64)) \
                or min(shape, default=0) < 0:
            raise KsaeError(f"{path}: tensor {name!r} names bytes {start}..{end} for shape {list(shape)}, outside its "
                            f"{data_bytes} bytes of data or not that shape's size; the file is damaged or not an export")
        tensors[name] = np.frombuffer(blob[8 + size + start:8 + size + end], dtype=dtype).reshape(shape).copy()
    return tensors, metadata


def read_export(path, format: str | None = None) -> tuple[dict, dict]:  # noqa: A002
    """``(tensors, metadata)`` of a file :func:`export` wrote: NumPy arrays by name, and the metadata as
    :func:`export_metadata` made it."""
    fmt = format_of(path, format)
    if fmt == "safetensors":
        tensors, text = read_safetensors(path)
        return tensors, {key: value if key in TEXT_FIELDS and value != "null" else json.loads(value)
                         for key, value in text.items()}
    if fmt == "npz":
        with np.load(path, allow_pickle=False) as f:
            tensors = {name: f[name] for name in f.files if name != METADATA_KEY}
            return tensors, json.loads(str(f[METADATA_KEY]))
    torch = require_torch()
    state = torch.load(path, weights_only=True)
    metadata = json.loads(state.pop(METADATA_KEY))
    return {name: value.numpy() for name, value in state.items()}, metadata
