"""Fashion-MNIST (Xiao, Rasul & Vollgraf, 2017): 60,000 training and 10,000 test 28x28
grey-scale images of clothing in 10 classes, in MNIST's IDX format and layout.

Not in the paper: a second real dataset, harder than MNIST, to show what the method does
beyond digits. It is read exactly as MNIST is (the same IDX reader, split and scaling).
The files are looked for in the data root's ``fashion-mnist`` folder, then where Debian's
``dataset-fashion-mnist`` package installs them, then fetched.
"""
from __future__ import annotations

from pathlib import Path

from ksae_cupy.datasets.fetch import FileSpec, HttpSource, ensure_files
from ksae_cupy.datasets.mnist import read_idx_quartet

# SHA-256 of the decompressed official files. Computed from Debian's dataset-fashion-mnist
# package (0.0~git20200523.55506a9-1); public code that checked the archives against
# Zalando's published gzip MD5s lists the same four digests.
FILES = [
    FileSpec("train-images-idx3-ubyte", "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"),
    FileSpec("train-labels-idx1-ubyte", "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"),
    FileSpec("t10k-images-idx3-ubyte", "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"),
    FileSpec("t10k-labels-idx1-ubyte", "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
]

# Tried in order: Zalando's download site, then the files in its GitHub repository.
SOURCES = [
    HttpSource("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"),
    HttpSource("https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/"),
]

# Where `apt-get install dataset-fashion-mnist` puts the four .gz files (used in place).
SEARCH = (Path("/usr/share/datasets/fashion-mnist"),)


def fetch(folder: Path, log=print) -> dict[str, Path]:
    """The four files, verified: from ``folder``, else from :data:`SEARCH`, else fetched into ``folder``."""
    return ensure_files(folder, FILES, SOURCES, "fashion-mnist", log=log, search=SEARCH)


def load_arrays(folder: Path, log=print):
    """``(X_train_nd, y_train_n, X_test_nd, y_test_n)`` as uint8 images and int64 labels."""
    return read_idx_quartet(fetch(folder, log=log), "Fashion-MNIST")
