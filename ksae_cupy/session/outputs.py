"""The one check every command runs before it writes a file the user named: no input is destroyed.

    check_output(path, "--out", runs=[run_dir], reads=[data_file], overwrite=overwrite)

refuses, in one line and before any work:

* a path that is a file of a run the command reads: its checkpoint, config.json, metrics, or the data
  files its config.json records (the training data, its labels, its test set and their labels);
* a path the command reads in the same invocation (``reads``);
* an existing file not named above without ``overwrite`` (``--overwrite`` on the command line);
* and what :func:`~ksae_cupy.paths.check_output_file` refuses (a folder at the path, a missing or
  unwritable folder, a file where a folder should be).

Paths are compared resolved (symlinks followed, relative paths made absolute), and as the same file
where both exist (a hard link is the same file under another name). Nothing here creates or changes
anything.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ksae_cupy.errors import KsaeError
from ksae_cupy.paths import check_output_file

OVERWRITE_HELP = "Replace the output file if it exists (never a file of the run or one this command reads)."


def run_inputs(source) -> dict[str, Path]:
    """``{what: path}`` of the files that make the run ``source`` (a run folder, or a checkpoint file inside
    one): its checkpoint, config.json and metrics, the data files config.json records, and a layer 2's codes
    origin (the ``OUT.json`` beside its codes)."""
    from ksae_cupy.session.trained_on import DATA_FILES, data_file, origin_file
    from ksae_cupy.session.runs import CHECKPOINT, CONFIG, METRICS

    source = Path(source)
    folder = source if source.is_dir() else source.parent
    files = {"checkpoint": folder / CHECKPOINT, "config.json": folder / CONFIG, "metrics": folder / METRICS,
             "metrics (compressed)": folder / (METRICS + ".gz")}
    if source.is_file():
        files["checkpoint"] = source
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError):
        return files
    if not isinstance(config, dict):
        return files
    if isinstance(config.get("dataset"), str) and config["dataset"]:
        files["data file"] = data_file(config["dataset"])
        if isinstance(config.get("codes_origin"), dict):  # layer 2: its codes' origin beside them (OUT.json)
            files["codes origin"] = origin_file(files["data file"])
    data = config.get("data")
    if isinstance(data, dict):
        from ksae_cupy.datasets.user_files import split_member

        for key, option in DATA_FILES.items():
            if isinstance(data.get(key), str) and data[key]:
                files[f"{option} file"] = split_member(data[key])[0]
    return files


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same resolved path, or (both there) the same inode."""
    a, b = Path(a), Path(b)
    if Path(os.path.realpath(a)) == Path(os.path.realpath(b)):
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path, what: str, *, runs=(), reads=(), overwrite: bool = False) -> None:
    """Refuse to write ``path`` (the option ``what`` named it) where that would destroy an input: a file of
    one of ``runs`` (run folders or their checkpoints, :func:`run_inputs`), a file in ``reads`` (the other
    paths this command reads), or, without ``overwrite``, any existing file."""
    path = Path(path)
    check_output_file(path, what)
    for run in runs:
        if run is None:
            continue
        for name, file in run_inputs(run).items():
            if same_file(path, file):
                raise KsaeError(f"{what} {path} is the {name} of run folder {run}; writing there would destroy it; "
                                f"choose another file")
    for file in reads:
        if file is not None and same_file(path, file):
            raise KsaeError(f"{what} {path} is {file}, which this command reads; writing there would destroy "
                            f"it; choose another file")
    if path.exists() and not overwrite:
        raise KsaeError(f"{what} {path} exists; pass --overwrite to replace it, or choose another file")
