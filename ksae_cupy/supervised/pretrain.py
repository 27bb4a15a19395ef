"""Greedy layer-wise pretraining (section 4.6) and loading pretrained run folders.

"We first train a shallow k-sparse autoencoder and obtain the hidden codes. We then fix
the features and train another k-sparse autoencoder on top of them."

Which codes: layer l+1 is trained on the **alpha*k-sparse** codes of layer l
(``transform(X, alpha=code_alpha)``, ``code_alpha`` defaulting to the fine-tuning alpha).
The paper does not say which; we choose the codes the second layer will actually receive
in the fine-tuned network, where every hidden layer keeps its alpha*k largest units
(section 4.6), so pretraining and fine-tuning see the same input distribution.
``code_alpha=1`` gives the plain k-sparse codes instead.
"""
from __future__ import annotations

from pathlib import Path

from ksae_cupy.errors import KsaeError
from ksae_cupy.training.estimator import KSparseAutoencoder
from ksae_cupy.training.runs import RunFolder


def pretrain_stack(X_nd, layer_settings: list[dict], code_alpha: float = 3.0, X_valid_nd=None, on_epoch=None):
    """Train one :class:`KSparseAutoencoder` per entry of ``layer_settings`` (its kwargs), greedily.

    Layer 1 learns on ``X_nd``; each next layer learns on the previous layer's
    ``code_alpha*k``-sparse codes, with the previous layers fixed. Returns the list.
    """
    models, inputs, valid = [], X_nd, X_valid_nd
    for settings in layer_settings:
        model = KSparseAutoencoder(**settings).fit(inputs, X_valid=valid, on_epoch=on_epoch)
        models.append(model)
        inputs = model.transform(inputs, alpha=code_alpha)
        valid = model.transform(valid, alpha=code_alpha) if valid is not None else None
    return models


def load_pretrained_run(run_dir, device: str = "cpu") -> tuple[KSparseAutoencoder, dict]:
    """The autoencoder of a ``ksae-train`` run folder and its ``config.json``.

    A missing folder, checkpoint or config is a one-line :class:`KsaeError`.
    """
    folder = RunFolder(Path(run_dir))
    if not folder.path.is_dir():
        raise KsaeError(f"pretrained run {folder.path}: no such run folder")
    if not folder.checkpoint.is_file():
        raise KsaeError(f"pretrained run {folder.path}: the folder holds no checkpoint.h5")
    config = folder.read_config()
    return KSparseAutoencoder.load(folder.checkpoint, device=device), config


def encoder_of(model: KSparseAutoencoder):
    """``(W_dh, b_h)`` host arrays of a fitted autoencoder's encoder."""
    from ksae_cupy.backend import to_host

    params = model.params_
    return to_host(params["W_dh"]), to_host(params["b_h"])
