"""Greedy layer-wise pretraining (section 4.6): loading pretrained run folders, and the codes a layer learns on.

"We first train a shallow k-sparse autoencoder and obtain the hidden codes. We then fix
the features and train another k-sparse autoencoder on top of them."

Which codes: layer l+1 is trained on the **alpha*k-sparse** codes of layer l
(``transform(X, alpha=alpha)``, ``alpha`` defaulting to the fine-tuning alpha).
The paper does not say which; we choose the codes the second layer will actually receive
in the fine-tuned network, where every hidden layer keeps its alpha*k largest units
(section 4.6), so pretraining and fine-tuning see the same input distribution.
``alpha=1`` gives the plain k-sparse codes instead.

:func:`write_codes` writes those codes of a ``ksae-train`` run's training set to an ``.npy``
file, for ``ksae-train CODES.npy`` to learn layer 2 in a process of its own (``bin/reproduce-finetune``);
of a ``ksae-baseline`` run it writes every sigmoid feature, for ``ksae-baseline FEATURES.npy``.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.session import trained_on
from ksae_cupy.training.estimator import KSparseAutoencoder
from ksae_cupy.session.runs import RunFolder


def load_pretrained_run(run_dir, device: str = "cpu", what: str = "pretrained run",
                        advice: str = "fine-tuning starts from ksae-train run folders",
                        ) -> tuple[KSparseAutoencoder, dict]:
    """The autoencoder of a ``ksae-train`` run folder and its ``config.json``.

    A missing folder, checkpoint or config is a one-line :class:`KsaeError`, worded by the caller: the
    folder is ``what``, and a folder of another kind is refused with ``advice`` (fine-tuning's by default).
    """
    folder = RunFolder(Path(run_dir))
    if not folder.path.is_dir():
        raise KsaeError(f"{what} {folder.path}: no such run folder")
    if not folder.checkpoint.is_file():
        raise KsaeError(f"{what} {folder.path}: the folder holds no checkpoint.h5")
    folder.check_kind(what, advice)
    config = folder.read_config()
    model = KSparseAutoencoder.load(folder.checkpoint, device=device)
    folder.check_checkpoint(model.run_id_, model.trainer_.config.to_dict())  # this folder's run, not a copy
    return model, config


def load_baseline_run(run_dir):
    """``(checkpoint, config.json)`` of a ``ksae-baseline`` run folder: a sigmoid layer to fine-tune."""
    from ksae_cupy.supervised.baseline_trainer import load_baseline_checkpoint

    folder = RunFolder(Path(run_dir), kind="ksae-baseline")
    folder.check_kind("pretrained run", "fine-tuning starts from ksae-train or ksae-baseline run folders")
    config = folder.read_config()
    ckpt = load_baseline_checkpoint(folder.checkpoint)
    folder.check_checkpoint(ckpt.run_id)  # this folder's run, not a copy
    return ckpt, config


def encoder_of(model: KSparseAutoencoder):
    """``(W_dh, b_h)`` host arrays of a fitted autoencoder's encoder, acting on raw inputs (a model
    trained on centred ones has the mean folded into ``b_h``: :func:`~ksae_cupy.datasets.preprocess.raw_input_params`)."""
    from ksae_cupy.backend import to_host
    from ksae_cupy.datasets.preprocess import raw_input_params

    params = raw_input_params(model.params_, model.preprocess_)
    return to_host(params["W_dh"]), to_host(params["b_h"])


# ksae-data codes of a folder of another kind (a fine-tuned network's): which folders it reads.
CODES_ADVICE = ("ksae-data codes reads the layers a stack is built from: ksae-train and ksae-baseline run folders "
                "(a {kind} run is a fine-tuned network, not a layer)")


CODE_LAYOUTS = {"csr": ".npz", "topk": ".npz", "dense": ".npy"}  # ksae-data codes --layout, and its file's suffix


def layout_of(out_path) -> str:
    """The codes' layout a file's suffix asks for: ``.npy`` dense, anything else CSR (an ``.npz``)."""
    return "dense" if Path(out_path).suffix == ".npy" else "csr"


def write_codes(run_dir, out_path, alpha: float | None = None, data_dir=None, device: str = "cpu",
                layout: str | None = None) -> dict:
    """Write the features of a pretrained run's training rows to ``out_path``, for the next layer.

    ``layout`` (:data:`CODE_LAYOUTS`): ``csr``, a SciPy CSR matrix (``scipy.sparse.save_npz``; ``ksae-train``
    reads it as its rows), the default for a ``ksae-train`` run; ``topk``, an ``.npz`` of ``indices`` and
    ``values`` (N x alpha*k: each row's kept columns, non-zero ones first, and their values) and ``n_hidden``;
    ``dense``, an N x H ``.npy`` (always for a ``ksae-baseline`` run, whose features are all non-zero).
    ``layout`` None: :func:`layout_of` the file's name (``.npz``: csr, ``.npy``: dense).
    ``alpha`` defaults by the package's one rule (:mod:`ksae_cupy.training.chosen_alpha`).

    A ``ksae-train`` run gives its ``alpha*k``-sparse codes (:meth:`KSparseAutoencoder.transform`);
    a ``ksae-baseline`` run every sigmoid unit of the uncorrupted input (:func:`baselines.encode`,
    the features the paper's stacks use; ``alpha`` does not apply and is recorded as None).
    The rows are those the run trained on: its dataset and data options (``config.json``),
    loaded and preprocessed as the run loaded them, from ``data_dir`` or else the run's own
    data root. Computed in float64 and written as float32, N x H, so that a file written again (with
    other BLAS threads, on another device) holds the same bytes, which a layer 2 resuming on it checks
    (float32 sums in another order differ in the last bit; see ``KSparseAutoencoder.transform``).
    Written to ``<out_path>.tmp`` and renamed, so ``out_path`` only ever holds a whole file. A run whose
    data file changed since it was trained is refused. Beside the codes, ``OUT.json`` records where they
    came from (:mod:`ksae_cupy.session.trained_on`; ``codes.npz`` -> ``codes.json``): the codes' SHA-256 and the run's folder, id, epoch
    and checkpoint SHA-256. Returns that record: the run folder, its epochs, alpha, the shape, the
    seconds taken, ``codes_sha256`` and ``layer``.
    """
    from ksae_cupy.backend import to_host
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.datasets.user_files import DataSpec
    from ksae_cupy.supervised.baseline_trainer import is_baseline_run

    start = time.perf_counter()
    if is_baseline_run(run_dir):
        from ksae_cupy.supervised.baselines import encode

        ckpt, config = load_baseline_run(run_dir)
        params64 = {name: np.asarray(to_host(ckpt.params[name]), dtype=np.float64) for name in ("W_dh", "b_h")}
        features, epochs, alpha = (lambda X: encode(params64, X.astype(np.float64))), ckpt.epoch, None
        layer = trained_on.layer_record(run_dir, config.get("run_id") or ckpt.run_id, ckpt.epoch, ckpt.step)
    else:
        model, config = load_pretrained_run(run_dir, device=device, what="RUN_DIR", advice=CODES_ADVICE)
        if alpha is None:
            from ksae_cupy.training.chosen_alpha import default_alpha

            alpha = model.alpha_ if model.alpha is not None else default_alpha(
                model.trainer_.config.k, model.trainer_.config.hidden)[0]
        layout = layout or layout_of(out_path)
        sparse = {"csr": True, "topk": "topk"}.get(layout, False)
        features, epochs = (lambda X: model.transform(X.astype(np.float32), alpha=alpha, dtype=np.float64,
                                                      sparse=sparse)), model.trainer_.epoch
        layer = trained_on.layer_record(run_dir, config.get("run_id") or model.run_id_, epochs, model.trainer_.step)
    trained_on.check_run_data(run_dir, config)  # the rows the run trained on, not a file replaced since
    spec = DataSpec.from_record(config["dataset"], config.get("data"))
    root = data_dir if data_dir is not None else config.get("data_dir")
    data = load_dataset(spec, root=Path(root) if root else None)
    codes = features(data.X_train)
    out_path = Path(out_path)
    tmp = out_path.with_name(out_path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:  # a file object: np.save would add .npy to a name
            if isinstance(codes, tuple):  # topk: each row's kept columns and their values
                H = model.trainer_.config.hidden
                np.savez(f, indices=codes[0], values=codes[1].astype(np.float32), n_hidden=np.int64(H))
                shape = [codes[0].shape[0], H]
            elif hasattr(codes, "tocsr"):
                import scipy.sparse

                codes = codes.astype(np.float32)
                scipy.sparse.save_npz(f, codes, compressed=False)
                shape = list(codes.shape)
            else:
                codes = np.asarray(codes, dtype=np.float32)
                np.save(f, codes)
                shape = list(codes.shape)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out_path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise KsaeError(f"could not write {out_path} ({exc.strerror or exc})") from None
    info = {"run_dir": str(run_dir), "dataset": config["dataset"], "epochs_trained": epochs,
            "alpha": alpha, "shape": shape, "layout": layout or "dense",
            "seconds": time.perf_counter() - start}
    try:  # OUT.json: where the codes came from, which a layer 2 trained on them records
        return trained_on.write_codes_origin(out_path, layer, info)
    except OSError as exc:
        raise KsaeError(f"could not write {trained_on.origin_file(out_path)} ({exc.strerror or exc})") from None


def write_asked_codes(run_dir, out, alpha, layout, data_dir, overwrite: bool) -> str:
    """``ksae-data codes``: its options checked against RUN_DIR's kind and OUT's suffix before any work, OUT and
    OUT.json checked writable, the codes written (:func:`write_codes`); returns the line that says so."""
    from ksae_cupy.session.outputs import check_output
    from ksae_cupy.supervised.baseline_trainer import is_baseline_run

    if alpha is not None and (alpha <= 0 or alpha != alpha):
        raise KsaeError(f"--alpha {alpha} is not allowed; use a positive number (the paper's 3, or 1)")
    baseline = is_baseline_run(run_dir)
    layout = layout or ("dense" if baseline else layout_of(out))
    if out.suffix != CODE_LAYOUTS[layout]:
        raise KsaeError(f"OUT {out} is not allowed with --layout {layout}; name an {CODE_LAYOUTS[layout]} file "
                        f"(ksae-train reads it)")
    if baseline and alpha is not None:
        raise KsaeError(f"--alpha {alpha} has no effect on {run_dir}, a ksae-baseline run folder: its codes are "
                        f"every sigmoid unit; leave --alpha out")
    if baseline and layout != "dense":
        raise KsaeError(f"--layout {layout} does not fit {run_dir}, a ksae-baseline run folder: its features are "
                        f"all non-zero; leave --layout out (dense)")
    for path in (out, trained_on.origin_file(out)):  # the codes and their origin, OUT.json
        check_output(path, "OUT", runs=[run_dir], overwrite=overwrite)
    info = write_codes(run_dir, out, alpha=alpha, data_dir=data_dir, layout=layout)
    alpha_words = "" if info["alpha"] is None else f", alpha {info['alpha']:g}"
    return (f"wrote {out}: {info['shape'][0]} x {info['shape'][1]} {layout} float32{alpha_words}, from {run_dir} "
            f"after {info['epochs_trained']} epochs, in {info['seconds']:.1f} s; their origin in "
            f"{trained_on.origin_file(out)}")
