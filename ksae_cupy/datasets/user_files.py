"""The user's own data: arrays read from ``.npy``, ``.npz`` and HDF5 files, labels, and splits.

A :class:`DataSpec` says where the data lies and how it is split; every command takes it
(DATASET plus ``--labels``, ``--test``, ``--test-labels``, ``--valid-fraction``,
``--test-fraction``, ``--split-seed``), the Python API as :func:`ksae_cupy.load_dataset`'s
arguments, and ``config.json`` records it so that a run's evaluation reloads the same splits.

    data.npz                   X (N x D), and when present y (N), X_test, y_test
    data.npz:name              one array of an .npz file
    codes.npz                  a SciPy CSR matrix (scipy.sparse.save_npz, ksae-data codes' default), as X
    data.npy                   an N x D array
    data.h5  or  data.h5:name  an HDF5 dataset (the file's only one, or the one named)

Labels are non-negative integers (class numbers), one per row, from the ``.npz``'s ``y`` or
from ``--labels`` (an ``.npy``, ``file.h5:name`` or ``file.npz:name``). The test set is the
``.npz``'s ``X_test`` / ``y_test``, or ``--test`` (a file in any of the forms above; an
``.npz`` brings its ``y``), or a seeded ``--test-fraction`` of the rows. The validation set
is a seeded ``--valid-fraction`` of the rows (0.1 by default).

Every reader checks sizes against the file before it allocates, and every failure is one
:class:`KsaeError` line naming the file.

Over 400 lines: the readers of every file form (.npy, .npz and its CSR form, HDF5) share those size checks
and one-line errors, and the splits are made from what they read.
"""
from __future__ import annotations

import math
import warnings
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ksae_cupy.datasets.dataset import Dataset, check_finite, check_float_input, check_magnitude
from ksae_cupy.paths import check_recorded_file
from ksae_cupy.errors import KsaeError, OptionError, literal

SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")
MEMBER_SUFFIXES = (".npz", ".h5", ".hdf5")  # files that hold named arrays: file.npz:name
# Class numbers are indices of the classifier's outputs: more than this is not a class label.
MAX_CLASSES = 100_000


def is_user_file(name: str) -> bool:
    return name.endswith(SUFFIXES) or any(f"{suffix}:" in name for suffix in MEMBER_SUFFIXES)


def split_member(spec: str) -> tuple[Path, str]:
    """``("file.h5", "name")`` of ``file.h5:name``; the member is "" when none is named."""
    for suffix in MEMBER_SUFFIXES:
        if f"{suffix}:" in spec:
            path_text, member = spec.rsplit(":", 1)
            return Path(path_text), member
    return Path(spec), ""


@dataclass(frozen=True)
class DataSpec:
    """A dataset and its splits: a built-in name, or a user file with labels and split options."""

    data: str
    labels: str | None = None
    test: str | None = None
    test_labels: str | None = None
    valid_fraction: float = 0.1
    test_fraction: float = 0.0
    split_seed: int = 0

    @property
    def is_user_file(self) -> bool:
        return is_user_file(self.data)

    def validate(self) -> "DataSpec":
        """Raise a one-line :class:`~ksae_cupy.errors.OptionError` on a bad option, naming it as
        Python does (``valid_fraction``; a command prints ``--valid-fraction``); return self."""
        if not self.is_user_file:
            given = [f for f in ("labels", "test", "test_labels") if getattr(self, f) is not None]
            given += [f for f, default in (("valid_fraction", 0.1), ("test_fraction", 0.0), ("split_seed", 0))
                      if getattr(self, f) != default]
            if given:
                raise OptionError(given[0], f"{{name}} is not allowed with the built-in dataset "
                                            f"{literal(repr(self.data))}, which has its own labels and splits; it "
                                            f"applies to your own files (.npy, .npz, .h5)")
            return self
        if self.test_labels is not None and self.test is None:
            raise OptionError("test_labels", f"{{name}} {literal(self.test_labels)} is not allowed without {{test}}; "
                                             f"name the test examples' file too")
        if self.test is not None and self.test_fraction:
            raise OptionError("test_fraction", f"{{name}} {self.test_fraction} is not allowed with {{test}}; take "
                                               f"the test set from the file or from a fraction of the data, not both")
        if not 0 < self.valid_fraction < 1:
            raise OptionError("valid_fraction", f"{{name}} {self.valid_fraction} is not allowed; use 0 < fraction < 1")
        if not 0 <= self.test_fraction < 1 or self.valid_fraction + self.test_fraction >= 1:
            raise OptionError("test_fraction", f"{{name}} {self.test_fraction} is not allowed; use 0 <= fraction < 1 "
                                               f"- {{valid_fraction}} ({self.valid_fraction}), leaving rows to train on")
        if not 0 <= self.split_seed <= 2**32 - 1:
            raise OptionError("split_seed", f"{{name}} {self.split_seed} is not allowed; use an integer from 0 to "
                                            f"{2**32 - 1}")
        return self

    def resolved(self) -> "DataSpec":
        """The same spec with absolute file paths (what config.json records: a run can then be
        evaluated or resumed from any folder)."""
        if not self.is_user_file:
            return self

        def absolute(spec):
            if spec is None:
                return None
            path, member = split_member(spec)
            return str(path.resolve()) + (f":{member}" if member else "")

        return replace(self, data=absolute(self.data), labels=absolute(self.labels), test=absolute(self.test),
                       test_labels=absolute(self.test_labels))

    def record(self) -> dict:
        """The split options for config.json (the data itself is recorded as ``dataset``)."""
        return {"labels": self.labels, "test": self.test, "test_labels": self.test_labels,
                "valid_fraction": self.valid_fraction, "test_fraction": self.test_fraction,
                "split_seed": self.split_seed}

    @classmethod
    def from_record(cls, dataset: str, record: dict | None) -> "DataSpec":
        """The spec a config.json recorded (runs from before the options: the defaults)."""
        fields = {key: value for key, value in (record or {}).items()
                  if key in ("labels", "test", "test_labels", "valid_fraction", "test_fraction", "split_seed")}
        recorded = [("labels", fields.get("labels")), ("test", fields.get("test")), ("test_labels", fields.get("test_labels"))]
        if not isinstance(dataset, str) or is_user_file(dataset):  # a built-in dataset's name is no path
            recorded.append(("dataset", dataset))
        for key, text in recorded:  # never a folder, a device or a pipe (paths.check_recorded_file)
            check_recorded_file(key, split_member(text)[0] if isinstance(text, str) and text.strip() else text)
        return cls(data=dataset, **fields)

    def for_run(self, **given) -> "DataSpec":
        """This spec (a run's, from its config.json) with the options a later command gave
        (those not None): labels and a test set may be added or replaced; the splits may not
        change, since the run trained on the rows they leave."""
        given = {key: value for key, value in given.items() if value is not None}
        for key in ("valid_fraction", "test_fraction", "split_seed"):
            if key in given and given[key] != getattr(self, key):
                raise OptionError(key, f"{{name}} {literal(given[key])} is not allowed: the run was trained with "
                                       f"{getattr(self, key)}, and another split would test on rows it trained on")
        spec = replace(self, **given)
        if "test" in given and "test_labels" not in given:
            spec = replace(spec, test_labels=None)  # a new test file brings its own labels
        return spec.validate().resolved()

    def files(self) -> list[Path]:
        """Every file the spec reads."""
        return [split_member(spec)[0] for spec in (self.data, self.labels, self.test, self.test_labels) if spec]


# -- loading -------------------------------------------------------------------------------

def load_user_data(spec: DataSpec) -> Dataset:
    """The :class:`Dataset` a user-file spec describes: float32 splits, int64 labels, checked."""
    X_nd, arrays = read_matrix(spec.data, defaults=("X",))
    check_finite(X_nd, spec.data)  # positions in the file as the user sees it, before any split
    check_magnitude(X_nd, spec.data)
    y_n = _labels_for(spec.data, spec.labels, arrays.get("y"), len(X_nd))
    X_test, y_test = None, None
    if spec.test is not None:
        X_test, test_arrays = read_matrix(spec.test, defaults=("X_test", "X"))
        fallback = test_arrays.get("y_test", test_arrays.get("y"))
        y_test = _labels_for(spec.test, spec.test_labels, fallback, len(X_test))
    elif "X_test" in arrays and not spec.test_fraction:
        X_test = _as_matrix(arrays["X_test"](), f"{spec.data}:X_test")
        y_test = _labels_for(spec.data, None, arrays.get("y_test"), len(X_test), member="y_test")
    if X_test is not None:
        check_finite(X_test, spec.test or f"{spec.data}:X_test")
        check_magnitude(X_test, spec.test or f"{spec.data}:X_test")
    if X_test is not None and X_test.shape[1] != X_nd.shape[1]:
        raise KsaeError(f"the test set {spec.test or spec.data + ':X_test'} has {X_test.shape[1]} columns, the data "
                        f"{X_nd.shape[1]}; both need the same features")
    if X_test is not None and (y_test is None) != (y_n is None):
        which = "the data has labels but the test set has none" if y_test is None else \
            "the test set has labels but the data has none"
        raise OptionError("labels", f"{which}; give both ({{name}} / {{test_labels}}, or y / y_test in an .npz) "
                                    f"or neither")

    n = len(X_nd)
    n_valid = max(1, int(round(spec.valid_fraction * n)))
    n_test = max(1, int(round(spec.test_fraction * n))) if spec.test_fraction else 0
    if n - n_valid - n_test < 1:
        raise KsaeError(f"{spec.data}: {n} rows leave none to train on after {n_valid} validation and {n_test} "
                        f"test rows; use more rows or smaller fractions")
    order = np.random.default_rng(spec.split_seed).permutation(n)
    valid, test, train = (np.sort(part) for part in np.split(order, [n_valid, n_valid + n_test]))
    if n_test:
        X_test, y_test = X_nd[test], (y_n[test] if y_n is not None else None)
    dataset = Dataset(name=spec.data, X_train=X_nd[train], X_valid=X_nd[valid], X_test=X_test,
                      y_train=y_n[train] if y_n is not None else None,
                      y_valid=y_n[valid] if y_n is not None else None, y_test=y_test)
    if y_n is not None:
        dataset.n_classes = _check_classes(spec, dataset)
    return dataset


def _labels_for(data_spec: str, labels_spec: str | None, in_file, n_rows: int, member: str = "y"):
    """Labels from ``labels_spec`` when given, else the data file's own (``in_file``: a reader or None)."""
    if labels_spec is not None:
        raw, _ = read_array(labels_spec, defaults=("y",))
        return check_labels(raw, n_rows, labels_spec)
    if in_file is not None:
        return check_labels(in_file(), n_rows, f"{split_member(data_spec)[0]}:{member}")
    return None


def check_labels(y, n_rows: int, what: str) -> np.ndarray:
    """Labels as int64 class numbers: one per row, integers, non-negative; else one line naming the fault."""
    y = np.asarray(y)
    if y.ndim == 2 and 1 in y.shape:
        y = y.reshape(-1)
    if y.ndim != 1:
        raise KsaeError(f"labels {what} have shape {y.shape}; use one class number per row (shape ({n_rows},))")
    if len(y) != n_rows:
        raise KsaeError(f"labels {what} hold {len(y)} values for {n_rows} rows of data; use one label per row")
    if y.dtype.kind == "b":
        y = y.astype(np.int64)
    if y.dtype.kind == "f":
        bad = ~np.isfinite(y) | (y != np.round(y))
        if bad.any():
            first = int(np.argmax(bad))
            raise KsaeError(f"labels {what} are not integers (row {first}: {y[first]}); use class numbers 0, 1, 2, ...")
    elif y.dtype.kind not in "iu":
        raise KsaeError(f"labels {what} have dtype {y.dtype}; use integer class numbers 0, 1, 2, ...")
    if len(y) and (y.min() < 0 or y.max() >= MAX_CLASSES):
        first = int(np.argmax((y < 0) | (y >= MAX_CLASSES)))
        raise KsaeError(f"labels {what} hold {y[first]} (row {first}); use class numbers 0 to {MAX_CLASSES - 1}")
    return y.astype(np.int64)


def _check_classes(spec: DataSpec, dataset: Dataset) -> int:
    classes = np.unique(dataset.y_train)
    if len(classes) < 2:
        source = spec.labels or f"{split_member(spec.data)[0]}:y"
        raise KsaeError(f"labels {source} hold one class ({classes[0]}) in the training rows; a classifier "
                        f"needs at least two")
    return int(max(int(y.max()) for y in (dataset.y_train, dataset.y_valid, dataset.y_test) if y is not None and
                   len(y))) + 1


# -- readers -------------------------------------------------------------------------------

def read_matrix(spec: str, defaults: tuple) -> tuple[np.ndarray, dict]:
    """An N x D float32 array from ``spec``, and the other arrays of its ``.npz`` (name -> reader)."""
    raw, arrays = read_array(spec, defaults)
    return _as_matrix(raw, spec), arrays


MIN_ROWS = 2  # a mean, a variance, a validation split: training needs rows that can differ


def check_matrix_shape(X, name: str) -> None:
    """``X`` is N x D with N >= 2 and D >= 1: the one check of a training set's shape, with the one message
    (``ksae-train``'s files and the estimator's ``fit``)."""
    shape = tuple(X.shape)
    if len(shape) == 2 and shape[0] < MIN_ROWS:
        raise KsaeError(f"{name}: array of shape {shape} (n_samples={shape[0]}); expected N x D with N >= {MIN_ROWS}")
    if len(shape) != 2 or shape[1] < 1:
        raise KsaeError(f"{name}: array of shape {shape}; expected N x D with N >= {MIN_ROWS}")


def _as_matrix(X, spec: str) -> np.ndarray:
    check_matrix_shape(X, spec)
    if not np.issubdtype(X.dtype, np.number) or np.iscomplexobj(X):
        raise KsaeError(f"{spec}: array of dtype {X.dtype}; expected real numbers")
    check_float_input(X, name=spec)  # unscaled integers (pixels 0..255) would make training diverge
    return X.astype(np.float32)


def read_array(spec: str, defaults: tuple) -> tuple[np.ndarray, dict]:
    """The array ``spec`` names (in an ``.npz`` named by no member: the first of ``defaults`` it
    holds, or its only array), and, for an ``.npz`` read through one of ``defaults``, readers of
    the file's other arrays by name, so that ``y`` and ``X_test`` come along with ``X``."""
    path, member = split_member(spec)
    if not path.is_file():
        raise KsaeError(f"data file {path} does not exist")
    if path.suffix == ".npy":
        if member:
            raise KsaeError(f"{spec}: an .npy file holds one array; drop ':{member}'")
        return read_npy(path), {}
    if path.suffix == ".npz":
        return _read_npz(path, member, defaults)
    if path.suffix in (".h5", ".hdf5"):
        return read_h5_array(path, member), {}
    raise KsaeError(f"data file {path} has suffix {path.suffix!r}; use .npy, .npz, .h5 or .hdf5")


def _read_npz(path: Path, member: str, defaults: tuple) -> tuple[np.ndarray, dict]:
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n[:-4] for n in archive.namelist() if n.endswith(".npy")]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise KsaeError(f"{path}: not a readable .npz file ({type(exc).__name__}: {_first_line(exc)})") from None
    if not member and CSR_ARRAYS <= set(names):  # scipy.sparse.save_npz's (ksae-data codes' default): rows as X
        return _read_csr(path), {}
    if not member:
        found = [name for name in defaults if name in names] or (names if len(names) == 1 else [])
        if not found:
            raise KsaeError(f"{path} holds arrays {names} and no {' or '.join(map(repr, defaults))}; name one as "
                            f"{path}:NAME")
        member = found[0]
    if member not in names:
        raise KsaeError(f"{path} has no array {member!r}; it holds {names}")
    others = {name: (lambda name=name: _read_npz_member(path, name)) for name in names if name != member}
    # The companions (y, X_test, y_test) belong to the file's X, not to an array picked by name.
    return _read_npz_member(path, member), others if member in defaults else {}


CSR_ARRAYS = {"data", "indices", "indptr", "shape", "format"}  # what scipy.sparse.save_npz writes


def _read_csr(path: Path) -> np.ndarray:
    """The dense float32 rows of a SciPy CSR matrix saved by ``scipy.sparse.save_npz``."""
    import scipy.sparse

    try:
        matrix = scipy.sparse.load_npz(path)
    except (OSError, ValueError, KeyError) as exc:
        raise KsaeError(f"{path}: not a readable sparse matrix ({type(exc).__name__}: {_first_line(exc)})") from None
    return np.asarray(matrix.toarray(), dtype=np.float32)


def _read_npz_member(path: Path, name: str) -> np.ndarray:
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo(name + ".npy")
            with archive.open(info) as f:
                return _read_npy_stream(f, info.file_size, f"{path}:{name}")
    except KsaeError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError, RuntimeError) as exc:
        raise KsaeError(f"{path}:{name}: not a readable array ({type(exc).__name__}: {_first_line(exc)})") from None


def read_npy(path: Path) -> np.ndarray:
    """The array of an ``.npy`` file, once its header's shape fits in the file's length
    (a damaged header must not make us allocate what the file does not hold)."""
    with open(path, "rb") as f:
        return _read_npy_stream(f, path.stat().st_size, str(path))


def _read_npy_stream(f, total_bytes: int, what: str) -> np.ndarray:
    fmt = np.lib.format
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NumPy's note on Python 2 headers
            version = fmt.read_magic(f)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise ValueError(f"unknown .npy version {version}")
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
            header_bytes = f.tell()
    except Exception as exc:  # noqa: BLE001 -- NumPy parses the header as Python source: any error means damage
        raise KsaeError(f"{what}: not a readable .npy file ({type(exc).__name__}: {_first_line(exc)})") from None
    data_bytes = total_bytes - header_bytes
    if dtype.hasobject:
        raise KsaeError(f"{what}: not a readable .npy file (it holds Python objects)")
    needed = math.prod(shape) * dtype.itemsize
    if needed > data_bytes:
        raise KsaeError(f"{what}: not a readable .npy file (header says {shape} {dtype}, which needs {needed} "
                        f"bytes; the file holds {data_bytes})")
    try:
        raw = f.read(needed)
        if len(raw) != needed:
            raise EOFError(f"{len(raw)} of {needed} data bytes")
        order = "F" if fortran else "C"
        return np.frombuffer(raw, dtype=dtype).reshape(shape, order=order).copy(order="K")
    except (ValueError, OSError, EOFError) as exc:
        raise KsaeError(f"{what}: not a readable .npy file ({_first_line(exc)})") from None


# Deflate, the strongest compression HDF5 files commonly use, shrinks data at most ~1032:1;
# a dataset that claims more than that per byte of file is refused before it is read.
MAX_COMPRESSION = 1032


def read_h5_array(path: Path, member: str) -> np.ndarray:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if not member:
                names = [n for n, obj in f.items() if isinstance(obj, h5py.Dataset)]
                if len(names) != 1:
                    raise KsaeError(f"{path} holds datasets {names}; name one as {path}:NAME")
                member = names[0]
            if member not in f or not isinstance(f[member], h5py.Dataset):
                raise KsaeError(f"{path} has no dataset {member!r}")
            dset = f[member]
            if dset.ndim not in (1, 2) or not np.issubdtype(dset.dtype, np.number) \
                    or np.issubdtype(dset.dtype, np.complexfloating):
                raise KsaeError(f"{path}:{member}: array of shape {dset.shape} {dset.dtype}; expected N x D real numbers")
            limit = path.stat().st_size * (MAX_COMPRESSION if dset.compression else 1)
            if dset.size * dset.dtype.itemsize > limit:
                raise KsaeError(f"{path}:{member}: shape {dset.shape} {dset.dtype} needs "
                                f"{dset.size * dset.dtype.itemsize} bytes, more than the file can hold")
            return dset[()]
    except KsaeError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, OverflowError) as exc:  # h5py's errors on damage
        raise KsaeError(f"{path}: not a readable HDF5 file ({type(exc).__name__}: {_first_line(exc)})") from None


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__

