"""The offline 'patches' dataset from scikit-image's bundled photographs."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from ksae_cupy.datasets.registry import DATASETS
from ksae_cupy.datasets import patches
from ksae_cupy.errors import KsaeError


def test_missing_scikit_image_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "skimage", None)  # makes `import skimage...` fail
    monkeypatch.setitem(sys.modules, "skimage.data", None)
    with pytest.raises(KsaeError) as info:
        patches.load(log=lambda m: None, n_patches=100)
    assert "pip install 'ksae-cupy[patches]'" in str(info.value) and "\n" not in str(info.value)


def test_photo_patches_are_seeded_and_drawn_from_every_photo():
    photos = [np.full((20, 30, 3), v, np.uint8) for v in (10, 200)]
    X_nd = patches.photo_patches(photos, 1000, 8, seed=3)
    np.testing.assert_array_equal(X_nd, patches.photo_patches(photos, 1000, 8, seed=3))
    assert X_nd.shape == (1000, 192)
    share = (X_nd[:, 0] == 10).mean()  # 13 * 23 = 299 and 299 positions: about half each
    assert 0.4 < share < 0.6


def test_load_from_bundled_photographs():
    pytest.importorskip("skimage", reason="scikit-image not installed (pip install 'ksae-cupy[patches]')")
    messages = []
    photos = patches.load_photos(log=messages.append)
    assert len(photos) == len(patches.PHOTOS), messages  # all bundled: no download attempted
    ds = patches.load(log=lambda m: None, n_patches=4000, seed=1)
    assert ds.X_train.shape == (3800, 192) and ds.X_valid.shape == (200, 192) and ds.image_shape == (8, 8, 3)
    X = np.concatenate([ds.X_train, ds.X_valid]).astype(np.float64)
    np.testing.assert_allclose(X.mean(axis=0), 0, atol=1e-4)
    e = np.linalg.eigvalsh(np.cov(X.T))
    assert abs(e[0]) < 1e-4 and e[-1] < 1  # LCN's null direction; the rest d / (d + 0.1)
    np.testing.assert_array_equal(patches.load(log=lambda m: None, n_patches=4000, seed=1).X_valid, ds.X_valid)


def test_registered():
    assert DATASETS["patches"].load.__name__ == "load_patches"
