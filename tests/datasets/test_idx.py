"""The IDX reader on files written in the official format (plain and gzip)."""
import numpy as np
import pytest

from ksae_cupy.datasets.idx import read_idx, write_idx
from ksae_cupy.errors import KsaeError


@pytest.mark.parametrize("name", ["images-idx3-ubyte", "images-idx3-ubyte.gz"])
def test_round_trip(tmp_path, name):
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / name, images)
    raw = (tmp_path / name).read_bytes()
    if not name.endswith(".gz"):
        assert raw[:8] == bytes([0, 0, 8, 3, 0, 0, 0, 5])  # magic 0x00000803, then N = 5 big-endian
    np.testing.assert_array_equal(read_idx(tmp_path / name), images)


def test_labels_round_trip(tmp_path):
    labels = np.arange(10, dtype=np.uint8)
    write_idx(tmp_path / "labels-idx1-ubyte", labels)
    np.testing.assert_array_equal(read_idx(tmp_path / "labels-idx1-ubyte"), labels)


def test_wrong_magic(tmp_path):
    (tmp_path / "f").write_bytes(bytes([0, 0, 9, 3]) + bytes(12))
    with pytest.raises(KsaeError, match="not an unsigned-byte IDX file"):
        read_idx(tmp_path / "f")


def test_truncated(tmp_path):
    write_idx(tmp_path / "f", np.zeros((4, 2, 2), dtype=np.uint8))
    data = (tmp_path / "f").read_bytes()
    (tmp_path / "f").write_bytes(data[:-3])
    with pytest.raises(KsaeError, match="13 bytes, header \\(4, 2, 2\\) needs 16"):
        read_idx(tmp_path / "f")
