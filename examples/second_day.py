"""A k-sparse autoencoder from training to PyTorch, end to end, in well under two minutes on a CPU.

    python examples/second_day.py --out /tmp/ksae-example            # synthetic 8x8 patches, nothing to fetch
    python examples/second_day.py --out /tmp/ksae-example --dataset mnist --epochs 10

1. train briefly (the Python API: ``KSparseAutoencoder``);
2. show its filters (a PNG; needs matplotlib, ``pip install '.[plot]'``);
3. get its codes, sparse (``transform(X, sparse=True)``: a SciPy CSR matrix);
4. classify them (logistic regression; scikit-learn, ``pip install '.[compare]'``);
5. export the weights (safetensors, with the input mean, alpha, dead units and firing counts);
6. read the export back without this package: with NumPy always, and in PyTorch where ``torch`` imports, and check
   that the kept units are ours (up to ties within float rounding).

``tests/test_examples.py`` runs it as CI does. Each step prints one line.
"""
from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="A new folder for the filters and the export.")
    parser.add_argument("--dataset", default="synthetic", help="synthetic (no download) or mnist, ...")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"--out {args.out} already exists; give a new folder")
    args.out.mkdir(parents=True)
    done = {}

    # 1. train briefly
    import ksae_cupy

    data = ksae_cupy.load_dataset(args.dataset)
    hidden, k = (1000, 25) if data.dim > 200 else (64, 5)
    ae = ksae_cupy.KSparseAutoencoder(n_hidden=hidden, k=k, epochs=args.epochs, n_threads=1, device="cpu")
    ae.fit(data.X_train, X_valid=data.X_valid)
    print(f"1. trained {hidden} units, k {k}, {args.epochs} epochs on {data.name}: validation FVE "
          f"{ae.score(data.X_valid):.3f}; {ae.unit_counts_['n_dead']} dead units")

    # 2. show the filters
    try:
        from ksae_cupy.evaluation.plots import save_filter_grid

        width, height = save_filter_grid(ae.components_.T, args.out / "filters.png", data.image_shape, n_filters=64)
        print(f"2. filters: {args.out / 'filters.png'} ({width}x{height} pixels)")
        done["filters"] = str(args.out / "filters.png")
    except ksae_cupy.KsaeError as missing:  # matplotlib not installed: said, and the rest goes on
        print(f"2. filters skipped: {missing}")

    # 3. sparse codes (alpha by the package's rule: 3 for a model no evaluation chose one for)
    codes_train = ae.transform(data.X_train, sparse=True)
    codes_test = ae.transform(data.X_test, sparse=True)
    print(f"3. codes: {codes_train.shape[0]} x {codes_train.shape[1]} CSR, {codes_train.nnz / codes_train.shape[0]:.0f} "
          f"non-zero a row (alpha {ae.alpha_:g} x k {k})")

    # 4. classify
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        print("4. classifier skipped: scikit-learn is not installed (pip install '.[compare]')")
    else:
        clf = LogisticRegression(max_iter=1000).fit(codes_train, data.y_train)
        done["test_error"] = 1 - clf.score(codes_test, data.y_test)
        print(f"4. logistic regression on the codes: test error {100 * done['test_error']:.2f}%")

    # 5. export
    path = args.out / "model.safetensors"
    metadata = ksae_cupy.export(ae, path)
    print(f"5. exported {path}: alpha {metadata['alpha']:g}, {metadata['n_dead']} dead units recorded")

    # 6. read it back without this package
    X = data.X_test[:1000]
    tensors, meta = read_safetensors(path)
    Z = X.astype(np.float64) @ tensors["encoder.weight"].T.astype(np.float64) + tensors["encoder.bias"]
    alpha_k = int(meta["alpha_k"])
    ours = ae.transform(X) != 0
    done["numpy_rows_differing"] = rows_differing_beyond_ties(Z, ours, alpha_k)
    print(f"6. NumPy alone: the same kept units as ours on {len(X) - done['numpy_rows_differing']} of {len(X)} rows "
          f"(the rest: ties within float rounding)" if done["numpy_rows_differing"] else
          f"6. NumPy alone: the same kept units as ours on all {len(X)} rows")
    try:
        import torch
    except ImportError:
        print("6. PyTorch part skipped: torch is not installed")
    else:
        done["torch_rows_differing"] = torch_check(torch, path, X, ours, alpha_k)
        print(f"6. PyTorch nn.Linear from the file: the same kept units on {len(X) - done['torch_rows_differing']} "
              f"of {len(X)} rows, every other a tie within float rounding")
    (args.out / "summary.json").write_text(json.dumps(done, indent=2) + "\n")
    return done


def read_safetensors(path: Path) -> tuple[dict, dict]:
    """The tensors and metadata of a safetensors file, read with NumPy from the format's specification."""
    blob = path.read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "U8": "u1"}
    start = 8 + size
    return {name: np.frombuffer(blob[start + e["data_offsets"][0]:start + e["data_offsets"][1]],
                                dtype=dtypes[e["dtype"]]).reshape(e["shape"]) for name, e in header.items()}, meta


def rows_differing_beyond_ties(Z_nh: np.ndarray, ours_nh: np.ndarray, kept: int, rtol: float = 1e-5) -> int:
    """Rows whose ``kept`` largest of ``Z_nh`` differ from our kept units (``ours_nh``); raises if a difference is
    not a tie within float rounding of the row's kept-th value. Returns the count of rows with a tie swapped."""
    order = np.argsort(-Z_nh, axis=1, kind="stable")
    theirs = np.zeros(Z_nh.shape, dtype=bool)
    np.put_along_axis(theirs, order[:, :kept], True, axis=1)
    boundary = np.take_along_axis(Z_nh, order[:, kept - 1:kept], axis=1)
    differ = theirs != ours_nh
    gap = np.abs(Z_nh - boundary)
    if (gap[differ] > np.broadcast_to(rtol * (1 + np.abs(boundary)), Z_nh.shape)[differ]).any():
        raise SystemExit("the export does not give our codes: a kept unit differs beyond float rounding")
    return int(differ.any(axis=1).sum())


def torch_check(torch, path: Path, X: np.ndarray, ours: np.ndarray, kept: int) -> int:
    """The export loaded into ``nn.Linear`` (through NumPy's reader: no safetensors package needed), encoded in
    float64, compared with our kept units."""
    tensors, _ = read_safetensors(path)
    D, H = tensors["decoder.weight"].shape
    encoder = torch.nn.Linear(D, H).double()
    encoder.load_state_dict({"weight": torch.from_numpy(tensors["encoder.weight"].astype(np.float64)),
                             "bias": torch.from_numpy(tensors["encoder.bias"].astype(np.float64))})
    with torch.no_grad():
        Z = encoder(torch.from_numpy(X.astype(np.float64))).numpy()
    return rows_differing_beyond_ties(Z, ours, kept)


if __name__ == "__main__":
    main()
