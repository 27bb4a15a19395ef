"""Python side of the CPU harness for the CUDA kernels: builds ``driver.cpp`` and runs launch plans on it.

The driver runs ``kernels/*.cu`` compiled for the host against ``cuda_host.h`` (that header says
what is emulated and what is checked). What it runs are the launchers' own plans
(:func:`ksae_cupy.gpu.cuda_kernels.plan_topk`, :func:`~ksae_cupy.gpu.cuda_kernels.plan_rows`) made on NumPy
arrays: the same kernel name, grid, block, shared memory and argument tuple a GPU would get. The
driver checks every argument against the kernel's C++ parameter types and sends the output arrays
back; :meth:`Driver.run` writes them into the plan's arrays, as the kernel would on a GPU.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64", np.dtype(np.int32): "int32",
               np.dtype(np.int64): "int64", np.dtype(np.uint32): "uint32"}
# -O2: fast enough; -fsanitize=bounds: out-of-bounds indexing of static shared arrays is reported.
CXXFLAGS = ["-std=c++20", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas", "-fno-extern-tls-init",
            "-fsanitize=bounds", "-fno-sanitize-recover=bounds"]


class HarnessError(RuntimeError):
    """The driver reported a fault of the kernel (the message is its report) or died."""


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


def build(out_dir: Path, source: Path, names, *, exe_name: str = "driver", optimize: str = "-O2",
          timeout: float = 600) -> Path:
    """Compile the driver for ``source`` (a .cu file) and the instantiations ``names`` into ``out_dir``."""
    cxx = compiler()
    if cxx is None:
        raise HarnessError("no C++ compiler (g++ or clang++) found")
    out_dir.mkdir(parents=True, exist_ok=True)
    table = out_dir / f"{exe_name}_table.inc"
    table.write_text("".join(f'{{"{n}", bind(&{n})}},\n' for n in names))
    exe = out_dir / exe_name
    cmd = [cxx, *[optimize if f == "-O2" else f for f in CXXFLAGS], "-include", str(HERE / "cuda_host.h"), f"-I{HERE}",
           f'-DKERNEL_SOURCE="{Path(source).resolve()}"', f'-DKERNEL_TABLE="{table.resolve()}"',
           str(HERE / "driver.cpp"), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise HarnessError(f"building the driver failed:\n{' '.join(cmd)}\n{proc.stderr[-6000:]}")
    return exe


def build_variants(out_dir: Path, variants, names, **kw) -> Path:
    """One driver for several versions of a kernel source (e.g. with planted bugs): ``variants`` is
    a list of ``(namespace, path)``; version ``ns`` is compiled inside ``namespace ns`` and its
    instantiations are listed as ``ns::<name>`` (see :class:`Driver`'s ``prefix``). One compiler run
    instead of one per version."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapper = out_dir / "variants.cu"
    wrapper.write_text("".join(
        f'CUDA_HOST_DYNAMIC_SHARED({ns}::ksae, smem_raw)\nnamespace {ns} {{\n#include "{Path(path).resolve()}"\n}}\n'
        for ns, path in variants))
    return build(out_dir, wrapper, [f"{ns}::{n}" for ns, _ in variants for n in names], **kw)


@dataclass(frozen=True)
class Schedule:
    """How the emulation orders the work: blocks, threads within a block (reshuffled after every
    barrier when "shuffle"), and which guard page the arrays touch.

    Thread orders "forward", "reverse", "shuffle" advance every thread one stretch per sweep;
    "warps-forward", "warps-reverse", "warps-shuffle" let each warp in turn run ahead of the
    others to its next barrier (cuda_host.h), which shows a barrier missing between phases."""

    block_order: str = "forward"
    thread_order: str = "forward"
    seed: int = 0
    data_at_end: bool = True  # arrays touch the guard page after them (else the one before)


SCHEDULES = tuple(Schedule(b, t, seed, end) for seed, (b, t, end) in enumerate(
    [("forward", "forward", True), ("reverse", "reverse", False), ("shuffle", "shuffle", True),
     ("forward", "warps-forward", False), ("reverse", "warps-reverse", True), ("shuffle", "warps-shuffle", False),
     ("forward", "reverse", False), ("reverse", "shuffle", True), ("shuffle", "forward", False)]))


class Driver:
    """A running driver process; :meth:`run` sends one launch plan and fills in its outputs."""

    def __init__(self, exe: Path, prefix: str = ""):
        self.exe = exe
        self.prefix = prefix  # "ns::" to run the plans on the kernels of build_variants' version ns
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.rows: dict[str, int] = {}  # kernel name -> rows run

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    def _fail(self, what: str):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait(timeout=60)
        err = self.proc.stderr.read().decode(errors="replace")
        raise HarnessError(f"{what} (driver exit status {self.proc.returncode}):\n{err.strip()}")

    def run(self, plan, schedule: Schedule = Schedule(), label: str = "-", rows: int | None = None) -> None:
        """Run a :class:`~ksae_cupy.gpu.cuda_kernels.KernelLaunch` whose arrays are NumPy arrays.

        As :func:`ksae_cupy.gpu.cuda_kernels._launch` does: zero the plan's ``zeroed`` outputs, skip a
        grid of 0, launch. The outputs are written back into the plan's arrays in place.
        """
        for i in plan.zeroed:
            plan.args[i].fill(0)
        self.rows[plan.name] = self.rows.get(plan.name, 0) + (rows if rows is not None else int(plan.args[0].shape[0]))
        if plan.grid == 0:
            return
        self.launch(plan.name, (int(plan.grid), 1, 1), (int(plan.block), 1, 1), plan.args, plan.outputs,
                    shared=(int(plan.shared_mem), int(plan.shared_optin), int(plan.static_shared)),
                    schedule=schedule, label=label)

    def launch(self, name: str, grid: tuple, block: tuple, args, outputs, *, shared=(0, 0, 0),
               schedule: Schedule = Schedule(), label: str = "-", only_changed: bool = False) -> None:
        """One launch of kernel ``name``: ``args`` are NumPy arrays (C-contiguous) and NumPy scalars
        (a Python int or float goes as the 64-bit value CuPy would pass, which the driver refuses
        for a 32-bit parameter); the arrays at the positions ``outputs`` come back in place.
        ``shared`` is (dynamic bytes, opt-in bytes or 0, static bytes). ``only_changed``: write an
        output back only if the kernel changed it (for arguments that alias the same memory)."""
        label = " ".join(label.split()) or "-"
        parts = [f"launch {self.prefix}{name}\n", f"label {label}\n", "grid {} {} {}\n".format(*grid),
                 "block {} {} {}\n".format(*block), "shared {} {} {}\n".format(*shared),
                 f"order {schedule.block_order} {schedule.thread_order} {int(schedule.seed)}\n"]
        payload = [p.encode() for p in parts]
        place = "end" if schedule.data_at_end else "start"
        outs = []
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                if not a.flags.c_contiguous:
                    raise HarnessError(f"argument {i} is not C-contiguous")
                role = "out" if i in outputs else "in"
                payload.append(f"array {DTYPE_NAMES[a.dtype]} {a.size} {role} {place}\n".encode())
                sent = a.tobytes()
                payload.append(sent)
                if role == "out":
                    outs.append((a, sent))
            elif isinstance(a, np.generic):
                payload.append(f"scalar {DTYPE_NAMES[a.dtype]} {a.item()!r}\n".encode())
            else:  # a Python int or float: CuPy passes it as a 64-bit value
                dtype = "float64" if isinstance(a, float) else "int64"
                payload.append(f"scalar {dtype} {a!r}\n".encode())
        payload.append(b"go\n")
        try:
            self.proc.stdin.write(b"".join(payload))
            self.proc.stdin.flush()
            header = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            header = b""
        if not header.startswith(b"done "):
            self._fail(f"launch {name} [{label}] failed")
        total = int(header.split()[1])
        data = self.proc.stdout.read(total)
        if len(data) != total:
            self._fail(f"launch {name} [{label}]: short answer")
        offset = 0
        for a, sent in outs:
            got = data[offset:offset + a.nbytes]
            offset += a.nbytes
            if only_changed and got == sent:
                continue
            a.reshape(-1).view(np.uint8)[:] = np.frombuffer(got, np.uint8)


class DriverPool:
    """One driver process per worker thread; :meth:`map` runs independent cases on all of them.

    Each case is a function of a :class:`Driver`. The drivers are single-threaded processes, so
    ``jobs`` of them use ``jobs`` cores while the Python threads wait on their pipes.
    """

    def __init__(self, exe: Path, jobs: int, prefix: str = ""):
        self.exe = exe
        self.prefix = prefix
        self.jobs = max(1, int(jobs))
        self._local = threading.local()
        self._drivers: list[Driver] = []
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(self.jobs)  # kept: each of its threads keeps its driver

    def _driver(self) -> Driver:
        d = getattr(self._local, "driver", None)
        if d is None or d.proc.poll() is not None:
            d = Driver(self.exe, self.prefix)
            self._local.driver = d
            with self._lock:
                self._drivers.append(d)
        return d

    def map(self, cases) -> list:
        return list(self._executor.map(lambda case: case(self._driver()), list(cases)))

    def rows(self) -> dict[str, int]:
        total: dict[str, int] = {}
        with self._lock:
            for d in self._drivers:
                for name, n in d.rows.items():
                    total[name] = total.get(name, 0) + n
        return total

    def close(self) -> None:
        self._executor.shutdown()
        for d in self._drivers:
            d.close()
