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


def write_idx_quartet(folder, images_random: bool = True):
    """MNIST-shaped IDX files (.gz) in ``folder``; returns ``(arrays, specs)`` with their digests."""
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (60_000, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, 60_000, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (10_000, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, 10_000, dtype=np.uint8),
    }
    if not images_random:  # mostly zeros: quick to compress
        for name in ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte"):
            arrays[name][:, 4:] = 0
    folder.mkdir(parents=True, exist_ok=True)
    specs = []
    for name, array in arrays.items():
        write_idx(folder / (name + ".gz"), array)
        header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
        specs.append(FileSpec(name, hashlib.sha256(header + array.tobytes()).hexdigest()))
    return arrays, specs


def test_mnist_reads_the_gz_files_when_only_they_are_present(tmp_path, monkeypatch):
    arrays, specs = write_idx_quartet(tmp_path)
    # The real files' digests stand for MNIST itself; these stand for the files this test wrote.
    monkeypatch.setattr(mnist, "FILES", specs)
    monkeypatch.setattr(mnist, "SOURCES", [_NoNetwork()])

    X_train, y_train, X_test, y_test = mnist.load_arrays(tmp_path, log=lambda msg: None)

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(name + ".gz" for name in arrays)
    np.testing.assert_array_equal(X_train, arrays["train-images-idx3-ubyte"].reshape(60_000, 784))
    np.testing.assert_array_equal(y_train, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(X_test, arrays["t10k-images-idx3-ubyte"].reshape(10_000, 784))
    np.testing.assert_array_equal(y_test, arrays["t10k-labels-idx1-ubyte"])


def test_fashion_mnist_loads_by_name_from_the_package_folder_as_mnist_does(tmp_path, monkeypatch):
    from ksae_cupy.datasets import fashion_mnist, load_dataset

    package = tmp_path / "package"
    arrays, specs = write_idx_quartet(package, images_random=False)
    monkeypatch.setattr(fashion_mnist, "FILES", specs)
    monkeypatch.setattr(fashion_mnist, "SOURCES", [_NoNetwork()])
    monkeypatch.setattr(fashion_mnist, "SEARCH", (package,))

    data = load_dataset("fashion-mnist", root=tmp_path / "root", log=lambda msg: None)

    assert data.name == "fashion-mnist" and data.n_classes == 10 and data.image_shape == (28, 28)
    assert (len(data.X_train), len(data.X_valid), len(data.X_test)) == (50_000, 10_000, 10_000)
    train, valid = mnist.train_valid_split(60_000, mnist.N_VALID)  # MNIST's split and scaling
    np.testing.assert_array_equal(data.y_valid, arrays["train-labels-idx1-ubyte"][valid])
    np.testing.assert_array_equal(np.rint(data.X_test * 255), arrays["t10k-images-idx3-ubyte"].reshape(10_000, 784))
    assert not (tmp_path / "root").exists()  # read in place, nothing written under the data root
