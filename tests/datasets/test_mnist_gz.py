"""MNIST from its four .gz files alone (how it travels to a GPU machine): read, never fetched."""
from __future__ import annotations

import hashlib

import numpy as np

from ksae_cupy.datasets import mnist
from ksae_cupy.datasets.fetch import FileSpec
from ksae_cupy.datasets.idx import write_idx


class _NoNetwork:
    def describe(self):
        return "no network"

    def fetch(self, spec, tmp_path, cache):
        raise AssertionError(f"tried to fetch {spec.name} although its .gz copy is present")


def test_mnist_reads_the_gz_files_when_only_they_are_present(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (60_000, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, 60_000, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (10_000, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, 10_000, dtype=np.uint8),
    }
    specs = []
    for name, array in arrays.items():
        write_idx(tmp_path / (name + ".gz"), array)
        header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
        specs.append(FileSpec(name, hashlib.sha256(header + array.tobytes()).hexdigest()))
    # The real files' digests stand for MNIST itself; these stand for the files this test wrote.
    monkeypatch.setattr(mnist, "FILES", specs)
    monkeypatch.setattr(mnist, "SOURCES", [_NoNetwork()])

    X_train, y_train, X_test, y_test = mnist.load_arrays(tmp_path, log=lambda msg: None)

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(name + ".gz" for name in arrays)
    np.testing.assert_array_equal(X_train, arrays["train-images-idx3-ubyte"].reshape(60_000, 784))
    np.testing.assert_array_equal(y_train, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(X_test, arrays["t10k-images-idx3-ubyte"].reshape(10_000, 784))
    np.testing.assert_array_equal(y_test, arrays["t10k-labels-idx1-ubyte"])
