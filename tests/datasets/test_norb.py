"""Small NORB: the binary matrix format, crop + bicubic resize, standardisation, loading."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from ksae_cupy.datasets.registry import DATASETS
from ksae_cupy.datasets import norb
from ksae_cupy.datasets.fetch import FileSpec
from ksae_cupy.errors import KsaeError


def one_line(info) -> str:
    assert "\n" not in str(info.value)
    return str(info.value)


def test_matrix_files_round_trip_with_exact_headers(tmp_path):
    rng = np.random.default_rng(0)
    dat = rng.integers(0, 256, (3, 2, 96, 96), dtype=np.uint8)
    cat = np.array([4, 0, 2], dtype=np.int32)
    norb.write_norb_matrix(tmp_path / "dat.mat", dat)
    norb.write_norb_matrix(tmp_path / "cat.mat.gz", cat)
    raw = (tmp_path / "dat.mat").read_bytes()
    assert raw[:24] == struct.pack("<6i", 0x1E3D4C55, 4, 3, 2, 96, 96) and len(raw) == 24 + dat.size
    raw = gzip.decompress((tmp_path / "cat.mat.gz").read_bytes())
    assert raw == struct.pack("<5i", 0x1E3D4C54, 1, 3, 1, 1) + cat.tobytes()  # 1-D: padded to 3 sizes
    np.testing.assert_array_equal(norb.read_norb_matrix(tmp_path / "dat.mat"), dat)
    back = norb.read_norb_matrix(tmp_path / "cat.mat.gz")
    assert back.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(back, cat)


def test_real_file_specs_match_the_official_layout():
    sizes = {s.name: s.size for s in norb.FILES}
    assert sizes[norb.TRAIN_DAT] == sizes[norb.TEST_DAT] == 24 + 24_300 * 2 * 96 * 96
    assert sizes[norb.TRAIN_CAT] == sizes[norb.TEST_CAT] == 20 + 24_300 * 4
    assert all(s.md5 and s.check for s in norb.FILES)


@pytest.mark.parametrize("mangle, why", [
    (lambda raw: struct.pack("<i", 0x1E3D4C51) + raw[4:], "wrong magic number 0x1E3D4C51"),
    (lambda raw: raw[:4] + struct.pack("<i", 0) + raw[8:], "0 dimensions"),
    (lambda raw: raw[:-1], "NORB data holds"),
    (lambda raw: raw + b"\0", "NORB data holds"),
    (lambda raw: raw[:6], "header truncated"),
    (lambda raw: raw[:14], "header truncated"),
])
def test_bad_matrix_files_are_one_line_errors(tmp_path, mangle, why):
    norb.write_norb_matrix(tmp_path / "ok.mat", np.zeros((2, 2, 96, 96), dtype=np.uint8))
    (tmp_path / "bad.mat").write_bytes(mangle((tmp_path / "ok.mat").read_bytes()))
    with pytest.raises(KsaeError) as info:
        norb.read_norb_matrix(tmp_path / "bad.mat")
    assert why in one_line(info)


@pytest.mark.parametrize("dat_shape, cat, why", [
    ((4, 2, 64, 64), [0, 1, 2, 3], "expected (N, 2, 96, 96)"),
    ((4, 2, 96, 96), [0, 1, 2], "expected (4,)"),
    ((4, 2, 96, 96), [0, 1, 2, 7], "expected 5 classes"),
    ((4, 2, 96, 96), [0, 1, 2, -1], "expected 5 classes"),
    ((3, 2, 96, 96), [0, 1, 2], "holds 3 examples; expected 4"),
])
def test_wrong_shapes_and_classes_are_one_line_errors(dat_shape, cat, why):
    with pytest.raises(KsaeError) as info:
        norb.check_pair(np.zeros(dat_shape, np.uint8), np.array(cat, np.int32), "training", n_expected=4)
    assert why in one_line(info)


def test_bicubic_halving_is_keys_cubic_with_antialiasing():
    R = norb.resize_matrix(64, 32)
    np.testing.assert_allclose(R.sum(axis=1), 1.0, atol=1e-12)
    # Interior rows: the kernel h(x / 2) / 2 at offsets +-0.5 .. +-3.5 (Keys, a = -0.5).
    taps = np.array([-0.0234375, -0.0703125, 0.2265625, 0.8671875, 0.8671875, 0.2265625, -0.0703125, -0.0234375]) / 2
    np.testing.assert_allclose(R[10, 17:25], taps, atol=1e-12)
    assert np.count_nonzero(R[10]) == 8
    ramp = np.arange(64.0)
    np.testing.assert_allclose((R @ ramp)[2:-2], 2 * np.arange(2, 30) + 0.5, atol=1e-12)  # linear kept exactly


def test_crop_resize_takes_the_inner_64_and_puts_channels_side_by_side():
    dat = np.full((3, 2, 96, 96), 255, dtype=np.uint8)  # the border must not leak in
    dat[:, 0, 16:80, 16:80] = 10
    dat[:, 1, 16:80, 16:80] = 200
    X_nd = norb.crop_resize(dat, chunk=2)
    assert X_nd.shape == (3, 2048) and X_nd.dtype == np.float32
    image = X_nd[1].reshape(norb.IMAGE_SHAPE)
    np.testing.assert_allclose(image[:, :32], 10, atol=1e-4)
    np.testing.assert_allclose(image[:, 32:], 200, atol=1e-4)


def _random_norb(n, seed):
    rng = np.random.default_rng(seed)
    dat = rng.integers(0, 256, (n, 2, 96, 96), dtype=np.uint8)
    dat[:, :, 40:56, 40:56] //= 4  # give dimensions different means and spreads
    return dat, (np.arange(n) % 5).astype(np.int32)


def test_standardisation_uses_the_whole_training_file():
    dat, cat = _random_norb(60, 1)
    dat_test, cat_test = _random_norb(10, 2)
    ds = norb.make_dataset(dat, cat, dat_test, cat_test, n_valid=12, seed=3)
    assert ds.X_train.shape == (48, 2048) and ds.X_valid.shape == (12, 2048) and ds.X_test.shape == (10, 2048)
    X_all = np.concatenate([ds.X_train, ds.X_valid]).astype(np.float64)
    np.testing.assert_allclose(X_all.mean(axis=0), 0, atol=1e-5)  # float32 rounding only
    np.testing.assert_allclose(X_all.std(axis=0), 1, atol=1e-5)
    raw_test = norb.crop_resize(dat_test)
    np.testing.assert_allclose(ds.X_test, (raw_test - ds.preprocess["mean"]) / ds.preprocess["std"], rtol=1e-6)
    assert ds.n_classes == 5 and ds.image_shape == (32, 64)
    assert set(ds.preprocess) == {"mean", "std"} and ds.preprocess["mean"].shape == (2048,)


def test_load_end_to_end_from_synthetic_files(tmp_path):
    folder = tmp_path / "norb"
    folder.mkdir()
    dat, cat = _random_norb(20, 4)
    dat_test, cat_test = _random_norb(8, 5)
    norb.write_norb_matrix(folder / norb.TRAIN_DAT, dat)
    norb.write_norb_matrix(folder / (norb.TRAIN_CAT + ".gz"), cat)  # a .gz copy counts
    norb.write_norb_matrix(folder / norb.TEST_DAT, dat_test)
    norb.write_norb_matrix(folder / norb.TEST_CAT, cat_test)
    # The real specs (MD5, size, header) refuse these small files ...
    with pytest.raises(KsaeError) as info:
        norb.load(tmp_path, log=lambda m: None)
    assert "fails its check" in one_line(info) and "expected 447897624" in str(info.value)
    # ... specs with the small shapes (format check only) take them.
    files = [FileSpec(norb.TRAIN_DAT, check=norb.header_check(np.uint8, (20, 2, 96, 96))),
             FileSpec(norb.TRAIN_CAT, check=norb.header_check(np.int32, (20,))),
             FileSpec(norb.TEST_DAT, check=norb.header_check(np.uint8, (8, 2, 96, 96))),
             FileSpec(norb.TEST_CAT, check=norb.header_check(np.int32, (8,)))]
    ds = norb.load(tmp_path, log=lambda m: None, files=files, n_expected=None, n_valid=5)
    assert (len(ds.X_train), len(ds.X_valid), len(ds.X_test)) == (15, 5, 8)
    np.testing.assert_array_equal(np.sort(np.concatenate([ds.y_train, ds.y_valid])), np.sort(cat))
    bad_header = [FileSpec(norb.TRAIN_DAT, check=norb.header_check(np.uint8, (24300, 2, 96, 96)))] + files[1:]
    with pytest.raises(KsaeError) as info:
        norb.load(tmp_path, log=lambda m: None, files=bad_header, n_expected=None)
    assert "header announces uint8 (20, 2, 96, 96)" in one_line(info)


def test_registered():
    assert DATASETS["norb"].load.__name__ == "load_norb"
