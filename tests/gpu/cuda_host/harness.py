"""Python side of the CPU harness for the CUDA kernels: builds tests/cuda_host/driver.cpp and sends it launches.

The driver runs ``kernels/*.cu`` compiled for the host against ``cuda_host.h`` (see that header for
what is emulated and checked). A launch is described the way a CuPy launcher makes it: kernel
name, grid, block, dynamic shared memory, and the argument tuple of arrays and NumPy scalars; the
driver checks each argument against the kernel's parameter types and returns the output arrays.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ORDERS = ("forward", "reverse", "shuffle")
DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64", np.dtype(np.int32): "int32",
               np.dtype(np.int64): "int64", np.dtype(np.uint32): "uint32"}
CXXFLAGS = ["-std=c++20", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas", "-fno-extern-tls-init",
            "-fsanitize=bounds", "-fno-sanitize-recover=bounds"]


class HarnessError(RuntimeError):
    """The driver reported a fault (its stderr is the message) or died."""


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


def kernel_table(names) -> str:
    """The driver's table: one line per instantiation name, as the launchers spell it."""
    return "".join(f'{{"{n}", bind(&{n})}},\n' for n in names)


def build(out_dir: Path, source: Path, names, *, exe_name: str = "driver", timeout: float = 600) -> Path:
    """Compile the driver for ``source`` (a .cu file) and the instantiations ``names`` into ``out_dir``."""
    cxx = compiler()
    if cxx is None:
        raise HarnessError("no C++ compiler (g++ or clang++) found")
    out_dir.mkdir(parents=True, exist_ok=True)
    table = out_dir / f"{exe_name}_table.inc"
    table.write_text(kernel_table(names))
    exe = out_dir / exe_name
    cmd = [cxx, *CXXFLAGS, "-include", str(HERE / "cuda_host.h"), f"-I{HERE}",
           f'-DKERNEL_SOURCE="{Path(source).resolve()}"', f'-DKERNEL_TABLE="{table.resolve()}"',
           str(HERE / "driver.cpp"), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise HarnessError(f"building the driver failed:\n{' '.join(cmd)}\n{proc.stderr[-6000:]}")
    return exe


@dataclass
class Launch:
    """One kernel launch: what a CuPy launcher passes to ``RawKernel.__call__`` (plus the opt-in)."""

    name: str
    grid: tuple
    block: tuple
    args: tuple
    outputs: tuple  # indexes into args of the arrays the kernel writes
    shared_mem: int = 0
    shared_optin: int = 0  # max_dynamic_shared_size_bytes the launcher sets; 0 if left alone
    label: str = ""


@dataclass
class Schedule:
    block_order: str = "forward"
    thread_order: str = "forward"
    seed: int = 0
    data_at_end: bool = True  # arrays touch the guard page after them (else the one before)


@dataclass
class Stats:
    launches: dict = field(default_factory=dict)  # kernel name -> launches
    rows: dict = field(default_factory=dict)  # kernel name -> rows compared
    seconds: float = 0.0

    def add(self, name: str, rows: int) -> None:
        self.launches[name] = self.launches.get(name, 0) + 1
        self.rows[name] = self.rows.get(name, 0) + rows


def _dims(d) -> tuple:
    d = tuple(int(x) for x in (d if isinstance(d, tuple) else (d,)))
    return d + (1,) * (3 - len(d))


class Driver:
    """A running driver process; :meth:`run` sends one launch and returns the output arrays."""

    def __init__(self, exe: Path):
        self.exe = exe
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.stats = Stats()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _fail(self, what: str):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait(timeout=60)
        err = self.proc.stderr.read().decode(errors="replace")
        raise HarnessError(f"{what} (driver exit status {self.proc.returncode}):\n{err.strip()}")

    def run(self, launch: Launch, schedule: Schedule = Schedule()) -> list:
        t0 = time.perf_counter()
        parts = [f"launch {launch.name}\n", f"label {launch.label or '-'}\n",
                 "grid {} {} {}\n".format(*_dims(launch.grid)), "block {} {} {}\n".format(*_dims(launch.block)),
                 f"shared {int(launch.shared_mem)} {int(launch.shared_optin)}\n",
                 f"order {schedule.block_order} {schedule.thread_order} {int(schedule.seed)}\n"]
        payload = [p.encode() for p in parts]
        outs = []
        place = "end" if schedule.data_at_end else "start"
        for i, a in enumerate(launch.args):
            if isinstance(a, np.ndarray):
                a = np.ascontiguousarray(a)
                role = "out" if i in launch.outputs else "in"
                payload.append(f"array {DTYPE_NAMES[a.dtype]} {a.size} {role} {place}\n".encode())
                payload.append(a.tobytes())
                if role == "out":
                    outs.append(a)
            elif isinstance(a, np.generic):
                payload.append(f"scalar {DTYPE_NAMES[a.dtype]} {a.item()!r}\n".encode())
            else:  # a Python int or float: CuPy would pass it as a 64-bit value
                dtype = "int64" if isinstance(a, (int, np.integer)) else "float64"
                payload.append(f"scalar {dtype} {a!r}\n".encode())
        payload.append(b"go\n")
        try:
            self.proc.stdin.write(b"".join(payload))
            self.proc.stdin.flush()
            header = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            header = b""
        if not header.startswith(b"done "):
            self._fail(f"launch {launch.name} [{launch.label}] failed")
        total = int(header.split()[1])
        data = self.proc.stdout.read(total)
        if len(data) != total:
            self._fail(f"launch {launch.name} [{launch.label}]: short answer")
        results, offset = [], 0
        for a in outs:
            n = a.nbytes
            results.append(np.frombuffer(data[offset:offset + n], dtype=a.dtype).reshape(a.shape).copy())
            offset += n
        self.stats.seconds += time.perf_counter() - t0
        return results
