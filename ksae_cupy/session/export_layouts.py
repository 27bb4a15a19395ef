"""The folders the field's sparse-autoencoder libraries load, written from :mod:`ksae_cupy.session.export`'s tensors.

    saelens    sae_weights.safetensors + cfg.json   (SAELens: SAE.load_from_disk(folder), architecture "topk")
    sparsify   sae.safetensors + cfg.json           (EleutherAI's sparsify: SparseCoder.load_from_disk(folder))
    both       ksae_cupy.safetensors                (the export's own tensors and metadata, beside them)

SAELens' names: ``W_enc`` (D x H), ``b_enc`` (H), ``W_dec`` (H x D), ``b_dec`` (D); it encodes
``topk(x W_enc + b_enc)`` (``apply_b_dec_to_input`` false) and decodes ``h W_dec + b_dec``: our model, the
mean of a --center-input run folded into the biases. sparsify subtracts ``b_dec`` from the input before its
encoder (``encoder.weight`` H x D, ``encoder.bias``): its ``encoder.bias`` is ours plus ``b_dec W``. Both libraries
keep only positive values of the top k (a ReLU): a linear unit kept with a negative value reads as 0 there.
Both load the weights file strictly (a tensor they do not know is an error), so the export's own tensors
(``input.mean``, ``units.*``, ``preprocess.*``) lie in a file of their own beside it, ``ksae_cupy.safetensors``;
the metadata is in both files' headers and under ``cfg.json``'s ``ksae_cupy``.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError

WEIGHTS = {"saelens": "sae_weights.safetensors", "sparsify": "sae.safetensors"}
CONFIG = "cfg.json"
EXTRAS = "ksae_cupy.safetensors"  # the export's own tensors: the libraries' weights files hold theirs only


def layout_tensors(layout: str, tensors: dict) -> dict:
    """The library's tensors (and no other: both libraries refuse a tensor they do not know) from the linear
    layout's."""
    W_hd, b_h = tensors["encoder.weight"], tensors["encoder.bias"]
    W_dh, c_d = tensors["decoder.weight"], tensors["decoder.bias"]
    if layout == "saelens":
        return {"W_enc": np.ascontiguousarray(W_hd.T), "b_enc": b_h, "W_dec": np.ascontiguousarray(W_dh.T),
                "b_dec": c_d}
    b_h_sparsify = (b_h.astype(np.float64) + c_d.astype(np.float64) @ W_hd.T.astype(np.float64)).astype(b_h.dtype)
    return {"encoder.weight": W_hd, "encoder.bias": b_h_sparsify, "W_dec": np.ascontiguousarray(W_dh.T),
            "b_dec": c_d}


def extra_tensors(tensors: dict) -> dict:
    """The export's own tensors (``input.mean``, ``units.*``, ``preprocess.*``): what is not a layer's."""
    return {name: value for name, value in tensors.items() if not name.startswith(("encoder.", "decoder."))}


def layout_config(layout: str, metadata: dict) -> dict:
    """The library's ``cfg.json``, with the export's metadata under ``ksae_cupy``."""
    D, H, k = metadata["n_inputs"], metadata["n_hidden"], metadata["k"]
    if layout == "saelens":
        config = {"architecture": "topk", "d_in": D, "d_sae": H, "activation_fn": "topk",
                  "activation_fn_kwargs": {"k": k}, "apply_b_dec_to_input": False, "normalize_activations": "none",
                  "dtype": metadata["dtype"], "device": "cpu", "model_name": "ksae-cupy", "hook_name": "input",
                  "hook_layer": 0, "context_size": 1, "prepend_bos": False, "dataset_path": "",
                  "finetuning_scaling_factor": False, "sae_lens_training_version": None}
    else:
        # sparsify's SparseCoderConfig fields; its expansion_factor (an int, used only where num_latents is 0)
        # is left to its default: num_latents says H
        config = {"d_in": D, "num_latents": H, "k": k, "activation": "topk", "normalize_decoder": False,
                  "multi_topk": False, "skip_connection": False, "transcode": False}
    return {**config, "ksae_cupy": metadata}


def write_layout(layout: str, folder, tensors: dict, metadata: dict, text_metadata: dict, safetensors_bytes) -> Path:
    """The folder ``folder`` (new, or refused) holding the library's weights, ``cfg.json`` and :data:`EXTRAS`,
    written whole: a temporary folder beside it, then a rename. ``safetensors_bytes(tensors, text_metadata)``: a
    safetensors file's bytes."""
    folder = Path(folder)
    if folder.exists():
        raise KsaeError(f"{folder} already exists; give another --out (an export folder is written new)")
    if not folder.parent.is_dir():
        raise KsaeError(f"the folder {folder.parent} of --out {folder} does not exist; create it first")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        (tmp / WEIGHTS[layout]).write_bytes(safetensors_bytes(layout_tensors(layout, tensors), text_metadata))
        (tmp / EXTRAS).write_bytes(safetensors_bytes(extra_tensors(tensors), text_metadata))
        (tmp / CONFIG).write_text(json.dumps(layout_config(layout, metadata), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder
