"""CIFAR-10 patches: the python archive format, patches, LCN, ZCA, the HDF5 cache."""
from __future__ import annotations

import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from ksae_cupy.datasets.registry import DATASETS
from ksae_cupy.datasets import cifar, preprocess
from ksae_cupy.datasets.fetch import FileSpec
from ksae_cupy.errors import KsaeError

TEST_SPEC = [FileSpec(cifar.ARCHIVE, check=cifar.archive_check)]


def one_line(info) -> str:
    assert "\n" not in str(info.value)
    return str(info.value)


def _batches(n_per_batch=20, seed=0, n_batches=5):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8), list(rng.integers(0, 10, n_per_batch)))
            for _ in range(n_batches)]


def test_archive_round_trip_and_pixel_layout(tmp_path):
    batches = _batches()
    cifar.write_archive(tmp_path / cifar.ARCHIVE, batches)
    images, y = cifar.read_archive(tmp_path / cifar.ARCHIVE, n_expected=100)
    assert images.shape == (100, 32, 32, 3) and images.dtype == np.uint8
    np.testing.assert_array_equal(y, np.concatenate([b[1] for b in batches]))
    row = batches[1][0][3]  # image 23: R plane, then G, then B, each 32 x 32 row-major
    for c in range(3):
        np.testing.assert_array_equal(images[23, :, :, c], row[1024 * c:1024 * (c + 1)].reshape(32, 32))


def test_real_file_spec():
    (spec,) = cifar.FILES
    assert spec.md5 == "c58f30108f718f92721af3b95e74349a" and spec.size == 170_498_071 and spec.sha256 is None


def _archive_with(tmp_path, name, raw):
    with tarfile.open(tmp_path / cifar.ARCHIVE, "w:gz") as archive:
        info = tarfile.TarInfo(cifar.MEMBER_DIR + name)
        info.size = len(raw)
        archive.addfile(info, io.BytesIO(raw))
    return tmp_path / cifar.ARCHIVE


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("payload, why", [
    ({b"data": np.zeros((4, 3000), np.uint8), b"labels": [0] * 4}, "expected N x 3072 uint8"),
    ({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1, 2]}, "expected 4 integers"),
    ({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1, 2, 10]}, "expected 10 classes"),
    ({b"labels": [0]}, "expected b'data' and b'labels'"),
    (_Evil(), "refusing to load"),
])
def test_bad_batches_are_one_line_errors(tmp_path, payload, why):
    path = _archive_with(tmp_path, "data_batch_1", pickle.dumps(payload, protocol=2))
    with pytest.raises(KsaeError) as info:
        cifar.read_archive(path, n_expected=None)
    assert why in one_line(info)


def test_bad_archives_are_one_line_errors(tmp_path):
    cifar.write_archive(tmp_path / cifar.ARCHIVE, _batches(n_batches=4))
    with pytest.raises(KsaeError) as info:
        cifar.read_archive(tmp_path / cifar.ARCHIVE, n_expected=None)
    assert "holds no cifar-10-batches-py/data_batch_5" in one_line(info)
    cifar.write_archive(tmp_path / cifar.ARCHIVE, _batches())
    with pytest.raises(KsaeError) as info:
        cifar.read_archive(tmp_path / cifar.ARCHIVE)  # 100 images, not 50,000
    assert "hold 100 images; expected 50000" in one_line(info)
    (tmp_path / "junk.tar.gz").write_bytes(b"not an archive at all")
    with pytest.raises(KsaeError) as info:
        cifar.read_archive(tmp_path / "junk.tar.gz")
    assert "not a readable tar archive" in one_line(info)


def test_random_patches_are_crops_at_seeded_positions():
    images = np.random.default_rng(1).integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    X_nd = preprocess.random_patches(images, 50, 8, seed=7, chunk=16)
    np.testing.assert_array_equal(X_nd, preprocess.random_patches(images, 50, 8, seed=7))
    rng = np.random.default_rng(7)  # the same draws, in the documented order
    which, tops, lefts = rng.integers(0, 6, 50), rng.integers(0, 25, 50), rng.integers(0, 25, 50)
    for i in (0, 17, 49):
        crop = images[which[i], tops[i]:tops[i] + 8, lefts[i]:lefts[i] + 8]
        np.testing.assert_array_equal(X_nd[i], crop.reshape(-1))


def test_lcn_gives_each_patch_mean_zero_and_damped_unit_variance():
    X_nd = np.random.default_rng(2).uniform(0, 255, (500, 192)).astype(np.float32)
    X_nd[:10] = 100 + X_nd[:10] / 1000  # nearly flat patches (variance ~0.005)
    var_before = X_nd.astype(np.float64).var(axis=1, ddof=1)
    Y = preprocess.local_contrast_normalise(X_nd.copy())
    np.testing.assert_allclose(Y.mean(axis=1), 0, atol=1e-5)
    # unbiased variance becomes v / (v + 10): ~1 for textured patches, ~0 for flat ones
    np.testing.assert_allclose(Y.astype(np.float64).var(axis=1, ddof=1), var_before / (var_before + 10), rtol=1e-4)
    assert Y[:10].std() < 0.1


def test_zca_whitened_covariance():
    rng = np.random.default_rng(3)
    A = rng.normal(size=(48, 48)) * np.logspace(0, -1, 48)  # correlated, eigenvalues spread 100x
    X_nd = (rng.normal(size=(10_000, 48)) @ A.T + 5).astype(np.float32)
    # With epsilon -> 0 the covariance of the result is the identity. The tolerance 2e-3 is
    # rounding only (the identity is exact algebra on the same sample): float32 storage of
    # X and P and float32 products over 48 terms, amplified by the condition number of C.
    mean_d, P_dd = preprocess.zca_fit(X_nd, epsilon=1e-9, chunk=3000)
    W = preprocess.zca_apply(X_nd.copy(), mean_d, P_dd).astype(np.float64)
    np.testing.assert_allclose(np.cov(W.T), np.eye(48), atol=2e-3)
    np.testing.assert_allclose(P_dd, P_dd.T, atol=1e-6)  # ZCA: symmetric, unlike PCA whitening
    # With epsilon > 0 the eigenvalues d of C become d / (d + epsilon) exactly.
    d = np.linalg.eigvalsh(np.cov(X_nd.T.astype(np.float64)))
    mean_d, P_dd = preprocess.zca_fit(X_nd, epsilon=0.5)
    W = preprocess.zca_apply(X_nd.copy(), mean_d, P_dd).astype(np.float64)
    np.testing.assert_allclose(np.linalg.eigvalsh(np.cov(W.T)), np.sort(d / (d + 0.5)), atol=2e-4)


def test_lcn_then_zca_pipeline():
    images = np.random.default_rng(4).integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)
    X_nd, mean_d, P_dd = preprocess.lcn_zca_patches(images, 6000, 8, seed=0)
    assert X_nd.shape == (6000, 192) and P_dd.shape == (192, 192)
    np.testing.assert_allclose(X_nd.mean(axis=0), 0, atol=1e-4)
    e = np.linalg.eigvalsh(np.cov(X_nd.T.astype(np.float64)))
    # LCN removes one direction (the patch mean): one eigenvalue 0, the rest d / (d + 0.1) < 1
    assert abs(e[0]) < 1e-4 and e[1] > 0.5 and e[-1] < 1


def test_load_caches_patches_atomically(tmp_path):
    (tmp_path / "cifar").mkdir()
    cifar.write_archive(tmp_path / "cifar" / cifar.ARCHIVE, _batches(40, seed=5))
    ds = cifar.load(tmp_path, log=lambda m: None, n_patches=3000, files=TEST_SPEC, n_expected=200)
    assert ds.X_train.shape == (2850, 192) and ds.X_valid.shape == (150, 192) and ds.y_train is None
    assert ds.image_shape == (8, 8, 3) and ds.preprocess["zca"].shape == (192, 192)
    cache = cifar.cache_path(tmp_path / "cifar", 3000, 0)
    assert sorted(p.name for p in (tmp_path / "cifar").iterdir()) == sorted([cifar.ARCHIVE, cache.name])
    (tmp_path / "cifar" / cifar.ARCHIVE).unlink()  # the second load needs only the cache
    again = cifar.load(tmp_path, log=lambda m: None, n_patches=3000, files=TEST_SPEC, n_expected=200)
    np.testing.assert_array_equal(again.X_valid, ds.X_valid)
    np.testing.assert_array_equal(again.preprocess["mean"], ds.preprocess["mean"])
    cache.write_bytes(b"truncated")  # a broken cache is rebuilt, never trusted (here: no archive)
    with pytest.raises(KsaeError) as info:
        cifar.load(tmp_path, log=lambda m: None, n_patches=3000, files=TEST_SPEC, n_expected=200)
    assert "could not fetch cifar-10-python.tar.gz" in one_line(info)


def test_real_spec_refuses_a_synthetic_archive(tmp_path):
    (tmp_path / "cifar").mkdir()
    cifar.write_archive(tmp_path / "cifar" / cifar.ARCHIVE, _batches())
    with pytest.raises(KsaeError) as info:
        cifar.load(tmp_path, log=lambda m: None, n_patches=100)
    assert "fails its check" in one_line(info) and "expected 170498071" in str(info.value)


def test_registered():
    assert DATASETS["cifar-patches"].load.__name__ == "load_cifar_patches"


def test_junk_archive_fails_the_format_check_in_one_line(tmp_path):
    (tmp_path / "cifar").mkdir()
    (tmp_path / "cifar" / cifar.ARCHIVE).write_bytes(b"<html>mirror error page</html>")
    with pytest.raises(KsaeError) as info:
        cifar.load(tmp_path, log=lambda m: None, n_patches=100, files=TEST_SPEC)
    assert "fails its check: format check failed" in one_line(info)


class _LeavesEvidence:
    """A pickle whose loading would call a function (here: create a file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_carrying_a_callable_is_refused_and_never_called(tmp_path):
    marker = tmp_path / "was-called"
    raw = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [_LeavesEvidence(marker)]}, protocol=2)
    with pytest.raises(KsaeError, match="refusing to load"):
        cifar.read_batch(raw, "data_batch_1")
    assert not marker.exists()
    assert pickle.loads(raw) is not None and marker.exists()  # the same bytes do call it when unpickled freely


def test_an_array_of_python_objects_is_refused():
    raw = pickle.dumps({b"data": np.array([[b"x"] * 3072], dtype=object), b"labels": [0]}, protocol=2)
    with pytest.raises(KsaeError, match="refusing an array of Python objects"):
        cifar.read_batch(raw, "data_batch_1")
