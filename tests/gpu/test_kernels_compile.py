"""Every kernel template instantiation listed in ksae_cupy.gpu.cuda_kernels.KERNEL_NAMES compiles with nvcc.

Runs without a GPU (CI has nvcc but no device): one nvcc call per architecture compiles a
translation unit that includes kernels/select_topk.cu and instantiates every listed template; the
resulting cubin must hold one kernel entry per instantiation. Skipped, with a reason, only when
nvcc is absent.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ksae_cupy.gpu import cuda_kernels as cuda


def instantiation_source(include_path: str | Path) -> str:
    """A ``.cu`` translation unit that includes the kernels and instantiates every ``cuda.KERNEL_NAMES`` entry.

    Taking each template kernel's address in a host function makes nvcc instantiate and compile
    it, without restating the parameter lists here.
    """
    lines = [f'#include "{Path(include_path).as_posix()}"', "", "void ksae_instantiate_all_kernels(void** out) {"]
    for i, name in enumerate(cuda.KERNEL_NAMES):
        lines.append(f"    out[{i}] = reinterpret_cast<void*>(&{name});")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for candidate in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


NVCC = _nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH or in /usr/local/cuda/bin")


def _mangled_count(ptxas_log: str) -> int:
    return len(set(re.findall(r"Compiling entry function '([^']+)'", ptxas_log)))


def _static_smem(ptxas_log: str) -> dict[str, int]:
    """Static shared memory per kernel entry: the "N bytes smem" ptxas prints after compiling it (0 if none)."""
    smem, entry = {}, None
    for line in ptxas_log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            entry = m.group(1)
            smem[entry] = 0
        m = re.search(r"(\d+) bytes smem", line)
        if m and entry is not None:
            smem[entry] = int(m.group(1))
    return smem


def _compiled_log(unit: Path, arch: str, kernel_names) -> str:
    """nvcc's and ptxas's report of compiling ``unit`` to a cubin for ``arch`` (every warning an error),
    after checking that it compiled, into one kernel entry per name of ``kernel_names``, none spilling."""
    cubin = unit.with_name(f"{unit.stem}_{arch}.cubin")
    cmd = [NVCC, "-std=c++17", "--cubin", f"-arch={arch}", "-Xptxas", "-v", "-Werror", "all-warnings",
           "-o", str(cubin), str(unit)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"nvcc failed for {arch}:\n{log[-4000:]}"
    assert cubin.stat().st_size > 0
    # ptxas reports each compiled kernel entry: every listed instantiation must be there.
    assert _mangled_count(log) == len(kernel_names), log[-4000:]
    # No kernel may spill to local memory (a sign of a wrong launch bound or runaway registers).
    assert all(int(s) == 0 for s in re.findall(r"(\d+) bytes spill stores", log)), log[-4000:]
    return log


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_all_instantiations_compile(arch, tmp_path: Path):
    source = tmp_path / "all_kernels.cu"
    source.write_text(instantiation_source(cuda.kernel_source_path()))
    log = _compiled_log(source, arch, cuda.KERNEL_NAMES)
    # The static shared memory the launch plans count (STATIC_SHARED_BYTES) is what ptxas allots.
    for entry, smem in _static_smem(log).items():
        method = ("threshold" if "topk_threshold" in entry else "sort" if "topk_sort" in entry
                  else "radix" if "topk_radix" in entry else None)
        assert smem == (cuda.STATIC_SHARED_BYTES[method] if method else 0), (entry, smem)


def test_kernel_names_cover_every_template():
    """The name list names each kernel template of the source for both dtypes."""
    text = cuda.kernel_source()
    templates = set(re.findall(r"__global__ void(?: __launch_bounds__\([\w, ]+\))?\s+(\w+_kernel)\(", text))
    assert templates == {"topk_threshold_kernel", "topk_sort_kernel", "topk_radix_kernel", "gather_rows_kernel",
                         "scatter_rows_kernel", "mask_rows_kernel"}
    for name in templates:
        for ctype in ("float", "double"):
            assert any(n.startswith(f"ksae::{name}<{ctype}") for n in cuda.KERNEL_NAMES), (name, ctype)



# The other sources (each its own RawModule): their module, and each entry's static shared memory.
OTHER_SOURCES = {
    "products": lambda entry: 2064 if "sum_squares" in entry else 0,  # the sums: 256 doubles + an int; the rest none
    "shuffle": lambda entry: 0,  # dynamic only
}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source", sorted(OTHER_SOURCES))
def test_the_other_kernel_sources_compile(source, arch, tmp_path: Path):
    """kernels/step_products.cu and kernels/draw_order.cu (the epoch graph's products, sums and order,
    ksae_cupy.gpu.products and .shuffle): every instantiation compiles, nothing spills, and the
    static shared memory is what the launch plans assume."""
    import importlib

    module = importlib.import_module(f"ksae_cupy.gpu.{source}")
    lines = [f'#include "{cuda.kernel_source_path(module.SOURCE_NAME).as_posix()}"', "",
             "void ksae_instantiate_all_kernels(void** out) {"]
    lines += [f"    out[{i}] = reinterpret_cast<void*>(&{name});" for i, name in enumerate(module.KERNEL_NAMES)]
    unit = tmp_path / f"{source}_all.cu"
    unit.write_text("\n".join(lines + ["}"]) + "\n")
    log = _compiled_log(unit, arch, module.KERNEL_NAMES)
    for entry, smem in _static_smem(log).items():
        assert smem == OTHER_SOURCES[source](entry), (entry, smem)
