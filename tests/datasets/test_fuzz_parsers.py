"""Fuzz tests of every parser of outside data: IDX, NORB's binary matrices, CIFAR batches,
the user's .npy and .h5 files.

Each parser gets a small valid file, then truncated copies, copies with flipped bits
(anywhere, and in the header), and random bytes. It must either return an array the file
could hold or raise :class:`KsaeError`: no other exception, no runaway parse (a bound on its
CPU time, which a loaded machine does not stretch as it does a wall-clock deadline) and no
allocation from an unchecked size field (tracemalloc's peak stays within a bound set by the
file's length). Examples are derandomised so CI runs the same cases each
time; the fuzz-case count in docs/guide/reliability.md is the sum of the max_examples below.
"""
import gzip
import io
import pickle
import tempfile
import time
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ksae_cupy.datasets import cifar, load_dataset
from ksae_cupy.datasets.idx import read_idx, write_idx
from ksae_cupy.datasets.norb import read_norb_matrix, write_norb_matrix
from ksae_cupy.errors import KsaeError

# No wall-clock deadline: on a loaded machine (this suite runs beside long trainings) one example can
# wait seconds for a core, and hypothesis's deadline then fails it, or calls it Flaky when the rerun is
# fast. parse_bounded bounds each parse's CPU time instead, which load does not stretch.
FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
CPU_SECONDS = 5.0  # per parse: small files; a parser looping on a damaged header would exceed it
FUZZ_SLOW = settings(FUZZ, max_examples=60)  # HDF5 and tar files: each case opens a real library file
SLACK_BYTES = 4 << 20  # the interpreter's own allocations while parsing (error messages, pickle frames)


def _flip(good: bytes, flips) -> bytes:
    raw = bytearray(good)
    for position, bit in flips:
        raw[position % len(raw)] ^= 1 << bit
    return bytes(raw)


def damaged(good: bytes, header: int = 64):
    """Truncated copies, bit flips anywhere, bit flips in the first ``header`` bytes, random bytes."""
    flips = lambda limit: st.lists(st.tuples(st.integers(0, limit - 1), st.integers(0, 7)), min_size=1, max_size=6)
    return st.one_of(
        st.integers(0, len(good) - 1).map(lambda n: good[:n]),
        flips(len(good)).map(lambda f: _flip(good, f)),
        flips(min(header, len(good))).map(lambda f: _flip(good, f)),
        st.binary(max_size=2 * len(good)),
    )


def parse_bounded(parse, raw: bytes):
    """``parse()``'s array, or None after a KsaeError; fails on any other exception, on an
    allocation far beyond the file's length, or on more than CPU_SECONDS of CPU time."""
    tracemalloc.start()
    cpu_start = time.process_time()
    try:
        result = parse()
    except KsaeError as exc:
        assert str(exc) and "\n" not in str(exc)
        result = None
    finally:
        cpu = time.process_time() - cpu_start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak <= 16 * len(raw) + SLACK_BYTES, f"parsing {len(raw)} bytes allocated {peak} bytes"
    assert cpu <= CPU_SECONDS, f"parsing {len(raw)} bytes took {cpu:.1f} s of CPU time"
    return result


@pytest.fixture(scope="module")
def folder():
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


def _bytes_of(write, name: str, array) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        write(Path(d) / name, array)
        return (Path(d) / name).read_bytes()


IMAGES = np.random.default_rng(0).integers(0, 256, (3, 6, 5), dtype=np.uint8)
GOOD_IDX = _bytes_of(write_idx, "f", IMAGES)


@pytest.mark.parametrize("gz", [False, True])
@FUZZ
@given(data=st.data())
def test_idx(folder, gz, data):
    raw = data.draw(damaged(GOOD_IDX, header=16))
    path = folder / ("f.gz" if gz else "f")
    path.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    X = parse_bounded(lambda: read_idx(path), raw)
    if X is not None:
        assert X.dtype == np.uint8 and X.nbytes <= len(raw)


GOOD_NORB = _bytes_of(write_norb_matrix, "f", IMAGES)
GOOD_NORB_INT = _bytes_of(write_norb_matrix, "f", np.arange(7, dtype=np.int32))


@pytest.mark.parametrize("good", [GOOD_NORB, GOOD_NORB_INT], ids=["bytes", "int32"])
@FUZZ
@given(data=st.data())
def test_norb(folder, good, data):
    raw = data.draw(damaged(good, header=40))
    path = folder / "m.mat"
    path.write_bytes(raw)
    X = parse_bounded(lambda: read_norb_matrix(path), raw)
    if X is not None:
        assert X.nbytes <= len(raw)


def _batch_pickle(n=4) -> bytes:
    rng = np.random.default_rng(1)
    return pickle.dumps({b"batch_label": b"training batch 1 of 5", b"labels": [int(v) for v in rng.integers(0, 10, n)],
                         b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"filenames": [b"x.png"] * n},
                        protocol=2)


GOOD_BATCH = _batch_pickle()


@FUZZ
@given(data=st.data())
def test_cifar_batch(data):
    raw = data.draw(damaged(GOOD_BATCH, header=200))
    result = parse_bounded(lambda: cifar.read_batch(raw, "data_batch_1"), raw)
    if result is not None:
        X, y = result
        assert X.dtype == np.uint8 and X.shape[1] == 3072 and y.shape == (len(X),)


def _archive_bytes() -> bytes:
    buffer = io.BytesIO()
    import tarfile

    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in cifar.TRAIN_BATCHES:
            info = tarfile.TarInfo(cifar.MEMBER_DIR + name)
            info.size = len(GOOD_BATCH)
            archive.addfile(info, io.BytesIO(GOOD_BATCH))
    return buffer.getvalue()


GOOD_ARCHIVE = _archive_bytes()


@FUZZ_SLOW
@given(data=st.data())
def test_cifar_archive(folder, data):
    raw = data.draw(damaged(GOOD_ARCHIVE))
    path = folder / cifar.ARCHIVE
    path.write_bytes(raw)
    # The archive is gzip: 16 x its length bounds what honest decompression of this size gives.
    parse_bounded(lambda: cifar.read_archive(path, n_expected=None), raw + bytes(16 * len(GOOD_BATCH)))


def _load_user_file_bytes(path: Path, raw: bytes) -> None:
    """Write ``raw`` as a user data file and load it: a finite float32 dataset or a KsaeError."""
    path.write_bytes(raw)
    dataset = parse_bounded(lambda: load_dataset(str(path)), raw)
    if dataset is not None:
        assert dataset.X_train.dtype == np.float32 and np.isfinite(dataset.X_train).all()


def _npy_bytes() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(2).normal(size=(6, 4)).astype(np.float32))
    return buffer.getvalue()


GOOD_NPY = _npy_bytes()


@FUZZ
@given(data=st.data())
def test_user_npy(folder, data):
    _load_user_file_bytes(folder / "x.npy", data.draw(damaged(GOOD_NPY, header=128)))


def _h5_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        with h5py.File(Path(d) / "x.h5", "w") as f:
            f.create_dataset("X", data=np.random.default_rng(3).normal(size=(6, 4)).astype(np.float32))
        return (Path(d) / "x.h5").read_bytes()


GOOD_H5 = _h5_bytes()


@FUZZ_SLOW
@given(data=st.data())
def test_user_h5(folder, data):
    _load_user_file_bytes(folder / "x.h5", data.draw(damaged(GOOD_H5, header=512)))


# -- size fields that lie: each parser must refuse before it allocates what the header claims -----

def test_lying_size_fields_are_refused_before_allocating(folder):
    huge = 2**31 - 1
    cases = {
        "idx": bytes([0, 0, 8, 2]) + np.asarray([huge, huge], ">i4").tobytes() + bytes(8),
        "mat": np.asarray([0x1E3D4C55, 3, huge, huge, huge], "<i4").tobytes() + bytes(8),
    }
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 4), }"
    cases["npy"] = b"\x93NUMPY\x01\x00" + len(header.ljust(117) + "\n").to_bytes(2, "little") \
        + (header.ljust(117) + "\n").encode() + bytes(16)
    readers = {"idx": read_idx, "mat": read_norb_matrix, "npy": lambda p: load_dataset(str(p))}
    for suffix, raw in cases.items():
        path = folder / f"lying.{suffix}"
        path.write_bytes(raw)
        with pytest.raises(KsaeError, match="needs|header says"):
            readers[suffix](path)
        assert parse_bounded(lambda: readers[suffix](path), raw) is None  # refused within the allocation bound

def test_h5_dataset_larger_than_its_file_is_refused(folder):
    path = folder / "sparse.h5"
    with h5py.File(path, "w") as f:  # chunks never written: HDF5 would hand back fill values
        f.create_dataset("X", shape=(10**6, 1000), dtype="f4", chunks=(100, 100))
    with pytest.raises(KsaeError, match="more than the file can hold"):
        load_dataset(str(path))
