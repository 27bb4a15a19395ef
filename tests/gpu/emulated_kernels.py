"""What the host-emulator tests of the kernel sources share (test_products_host.py, test_shuffle_host.py).

The harness (tests/gpu/cuda_host) and the mark that skips where no C++ compiler can build it (these
two test_kernels_host.py takes too); a module-wide driver of a source's unmodified kernels, a build
of a copy with a bug planted in it, and the check that a build answers wrong (or faults) on some
schedule. ``kernels`` is a launcher module of ksae_cupy.gpu: it names its source (SOURCE_NAME) and
the kernels to instantiate (KERNEL_NAMES).
"""
from __future__ import annotations

import sys
from contextlib import closing
from pathlib import Path

import pytest

from ksae_cupy.gpu import cuda_kernels

sys.path.insert(0, str(Path(__file__).parent / "cuda_host"))
import harness  # noqa: E402

needs_compiler = pytest.mark.skipif(harness.compiler() is None,
                                    reason="no C++ compiler (g++ or clang++) to build the harness")


def build(folder: Path, kernels, planted: tuple[str, str] | None = None) -> Path:
    """The harness executable of ``kernels``' source, built in ``folder``; with ``planted=(old, new)``,
    of a copy whose first ``old`` (which must be there) reads ``new``."""
    if planted is None:
        return harness.build(folder, cuda_kernels.kernel_source_path(kernels.SOURCE_NAME), kernels.KERNEL_NAMES)
    old, new = planted
    source = cuda_kernels.kernel_source(kernels.SOURCE_NAME)
    assert old in source, f"{old!r} is not in {kernels.SOURCE_NAME}"
    bad = folder / "bad.cu"
    bad.write_text(source.replace(old, new, 1))
    return harness.build(folder, bad, kernels.KERNEL_NAMES)


def driver_fixture(kernels):
    """A module-scoped fixture: a harness.Driver of ``kernels``' unmodified source, built once."""

    @pytest.fixture(scope="module")
    def driver(tmp_path_factory):
        with closing(harness.Driver(build(tmp_path_factory.mktemp(Path(kernels.SOURCE_NAME).stem), kernels))) as d:
            yield d

    return driver


def runs_wrong(exe: Path, answers_right) -> bool:
    """Whether the kernels built in ``exe`` fault, or ``answers_right(driver, schedule)`` is false, on
    any schedule of the harness."""
    with closing(harness.Driver(exe)) as d:
        try:
            return not all(answers_right(d, schedule) for schedule in harness.SCHEDULES)
        except harness.HarnessError:
            return True
