"""Offline natural-image patches: colour photographs shipped inside scikit-image.

A stand-in for the paper's CIFAR-10 patches that needs no download: random 8 x 8 x 3
patches (192 dimensions, like the CIFAR patches) of the colour photographs bundled in
scikit-image's wheel, with the same local contrast normalisation and ZCA whitening
(:mod:`.preprocess`). Only images stored in the wheel itself are used (``skimage.data``
fetches the others over the network); one that fails to load is skipped with a message.
Needs the optional extra: ``pip install 'ksae-cupy[patches]'``.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.datasets.preprocess import LCN_EPSILON, ZCA_EPSILON, lcn_zca, random_patches, split_rows

# skimage.data functions whose images are in the wheel (checked against scikit-image 0.26).
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "stereo_motorcycle")
N_PATCHES = 200_000
PATCH = 8
SEED = 0
VALID_FRACTION = 0.05
IMAGE_SHAPE = (PATCH, PATCH, 3)


def load_photos(names=PHOTOS, log=print) -> list[np.ndarray]:
    """The bundled colour photographs as H x W x 3 uint8 arrays."""
    try:
        import skimage.data
    except ImportError:
        raise KsaeError("the 'patches' dataset needs scikit-image: pip install 'ksae-cupy[patches]'") from None
    photos = []
    for name in names:
        try:
            image = getattr(skimage.data, name)()
        except Exception as exc:  # noqa: BLE001 -- a missing or network-only image is skipped, not fatal
            log(f"skipping skimage.data.{name}: {type(exc).__name__}: {exc}")
            continue
        if isinstance(image, tuple):  # stereo_motorcycle: (left, right, disparity)
            image = image[0]
        if image.ndim == 3 and image.shape[2] >= 3 and image.dtype == np.uint8:
            photos.append(np.ascontiguousarray(image[:, :, :3]))
    if not photos:
        raise KsaeError(f"none of the scikit-image photographs {', '.join(names)} could be loaded")
    return photos


def photo_patches(photos: list[np.ndarray], n_patches: int, size: int = PATCH, seed: int = SEED) -> np.ndarray:
    """``n_patches`` random patches (float32 rows, 0..255), from each photograph in
    proportion to its number of patch positions, in a seeded random order."""
    positions = np.array([(p.shape[0] - size + 1) * (p.shape[1] - size + 1) for p in photos], dtype=float)
    seeds = np.random.SeedSequence(seed).spawn(len(photos) + 1)
    counts = np.random.default_rng(seeds[0]).multinomial(n_patches, positions / positions.sum())
    X_nd = np.concatenate([random_patches(p[None], int(c), size, seeds[i + 1])
                           for i, (p, c) in enumerate(zip(photos, counts))])
    return X_nd[np.random.default_rng(seeds[0]).permutation(len(X_nd))]


def load(root=None, log=print, n_patches: int = N_PATCHES, seed: int = SEED, valid_fraction: float = VALID_FRACTION):
    """The ``patches`` Dataset (``root`` is unused: the images come with scikit-image)."""
    from ksae_cupy.datasets.dataset import Dataset

    if n_patches < 2:
        raise KsaeError(f"patches needs at least 2 patches, got {n_patches}")
    photos = load_photos(log=log)
    X_nd, mean_d, P_dd = lcn_zca(photo_patches(photos, n_patches, PATCH, seed))
    train, valid = split_rows(len(X_nd), valid_fraction, seed)
    return Dataset(name="patches", X_train=X_nd[train], X_valid=X_nd[valid], image_shape=IMAGE_SHAPE,
                   preprocess={"mean": mean_d, "zca": P_dd, "lcn_epsilon": np.float32(LCN_EPSILON),
                               "zca_epsilon": np.float32(ZCA_EPSILON)})
