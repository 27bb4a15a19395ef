"""The CUDA kernels of kernels/select_topk.cu, run on the CPU and compared bit for bit with ksae_cupy.topk.

No GPU needed: tests/gpu/cuda_host/ compiles the unmodified kernel source with the host C++
compiler against a header that emulates the CUDA built-ins (threads as fibers, __syncthreads,
warp shuffles with their masks, shared memory sized per launch and bounds-checked). What runs is
exactly what the launchers of ksae_cupy.gpu.cuda_kernels would launch: their plans (kernel name, grid,
block, shared memory, argument types) are made on NumPy arrays and handed to the emulation.

Checked here: every instantiation in KERNEL_NAMES on the contract's hard cases (ties at the k-th
value, +0/-0, +/-inf, NaN of any sign and payload, subnormals, random bit patterns, H from 1 to
16,384 and not a multiple of 32, k = 1 and k = H, N a prime, several rows per block), in forward,
reverse and shuffled block and thread orders, and with warps running ahead of each other between
barriers (harness.SCHEDULES); the fused training step built on the kernels; and, by planting bugs
in copies of the source (races, bounds, logic), that the harness fails when a kernel is wrong.
Not checked (only a GPU can): speed, NVRTC itself, real warp scheduling and memory ordering.

Run: ``pytest tests/gpu/test_kernels_host.py`` (about 2 minutes on 2 cores; ``-m slow`` adds the
long cases; ``-rP`` prints the rows compared per instantiation).
"""
from __future__ import annotations

import dataclasses
import os
import re
import time

import numpy as np
import pytest

from ksae_cupy.gpu import cuda_kernels as kernels
from ksae_cupy.gpu.cuda_kernels import next_pow2
from ksae_cupy.topk import topk_sort, topk_threshold

import emulated_kernels
from emulated_kernels import harness

pytestmark = emulated_kernels.needs_compiler

# The device the plans are made for: an H100 (132 SMs, 227 KiB of opt-in shared memory per block),
# the largest shared memory of any current GPU, so the largest rows any launch can have.
LIMITS = kernels.DeviceLimits(sm_count=132, shared_optin=227 * 1024)
JOBS = int(os.environ.get("KSAE_HARNESS_JOBS", min(2, os.cpu_count() or 1)))
REFERENCE = {"sort": topk_sort, "threshold": topk_threshold}
UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}
POISON = {np.dtype(np.float32): 0x7FC0DEAD, np.dtype(np.float64): 0x7FF8DEADBEEFDEAD}  # NaN with a payload
KINDS = ("random", "equal", "ties", "kth_ties", "zeros", "inf", "nan", "subnormal", "extremes", "bits")
# Row lengths: 1..16,384, around every multiple of 32 and of the block sizes the kernels use,
# and 12,000 (float32) / 6,000 (float64), where the threshold kernel needs the shared-memory opt-in
# only because of its static part.
H_SMALL = (1, 2, 3, 5, 17, 31, 32, 33, 100, 255, 256, 257, 511, 512, 513, 784, 1000, 1023, 1024, 1025)
H_LARGE = (1500, 2047, 2048, 2049, 4097, 6000, 8191, 12000, 16384)


class Mismatch(AssertionError):
    """A kernel's answer differs from the reference."""


# ------------------------------------------------------------------------------------------------
# Hard cases.

def _special_bits(dtype) -> np.ndarray:
    """Bit patterns of the values the contract singles out: zeros, infinities, NaNs of both signs
    with quiet and signalling payloads, subnormals, the extremes of the normal range."""
    if np.dtype(dtype) == np.float32:
        vals = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,
                0x7FFFFFFF, 0xFFFFFFFF, 0x7FC0BEEF, 0x7FA00000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,
                0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000]
        return np.array(vals, dtype=np.uint32)
    vals = [0x0, 0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000,
            0xFFF8000000000000, 0x7FF0000000000001, 0xFFF0000000000001, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF,
            0x7FF8DEADBEEF0000, 0x1, 0x8000000000000001, 0x000FFFFFFFFFFFFF, 0x800FFFFFFFFFFFFF,
            0x0010000000000000, 0x8010000000000000, 0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF,
            0x3FF0000000000000, 0xBFF0000000000000]
    return np.array(vals, dtype=np.uint64)


def make_rows(kind: str, N: int, H: int, k: int, rng: np.random.Generator, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    U = UINT[dtype]
    bits_per = dtype.itemsize * 8
    special = _special_bits(dtype)
    if kind == "random":
        Z = rng.standard_normal((N, H)).astype(dtype)
    elif kind == "equal":  # every entry of a row equal (a special value or not): ties everywhere
        values = np.concatenate([special, np.array([1.5, -3.25], dtype=dtype).view(U)])
        Z = np.repeat(rng.choice(values, size=(N, 1)), H, axis=1).view(dtype)
    elif kind == "ties":  # few distinct values: long runs of equal keys at the threshold
        Z = rng.integers(-2, 3, size=(N, H)).astype(dtype)
    elif kind == "kth_ties":  # the k-th value repeated far more often than the places left for it
        Z = np.empty((N, H), dtype=dtype)
        for n in range(N):
            above = int(rng.integers(0, k))  # entries strictly above the k-th value
            row = np.full(H, 0.25, dtype=dtype)
            row[:above] = 1.0 + rng.random(above)
            below = int(rng.integers(0, max(1, (H - above) // 2)))
            row[above:above + below] = -rng.random(below)
            Z[n] = rng.permutation(row)
    elif kind == "zeros":  # +0 and -0 (distinct keys, -0 below +0), a few tiny values
        Z = np.where(rng.random((N, H)) < 0.5, 0.0, -0.0).astype(dtype)
        Z[rng.random((N, H)) < 0.05] = dtype.type(np.finfo(dtype).smallest_subnormal)
    elif kind == "inf":
        Z = rng.standard_normal((N, H)).astype(dtype)
        Z[rng.random((N, H)) < 0.2] = np.inf
        Z[rng.random((N, H)) < 0.2] = -np.inf
    elif kind == "nan":  # NaNs of both signs, quiet and signalling, various payloads: all rank lowest
        Z = rng.standard_normal((N, H)).astype(dtype).view(U)
        nan_bits = special[np.isnan(special.view(dtype))]
        mask = rng.random((N, H)) < 0.4
        Z[mask] = rng.choice(nan_bits, size=int(mask.sum()))
        Z[:, 0] = nan_bits[0]
        Z = Z.view(dtype)
    elif kind == "subnormal":  # exponent field 0, both signs, plus zeros and the smallest normals
        mant = rng.integers(0, 1 << (23 if bits_per == 32 else 52), size=(N, H), dtype=np.uint64).astype(U)
        sign = (rng.random((N, H)) < 0.5).astype(U) << U(bits_per - 1)
        Z = (mant | sign).view(dtype)
    elif kind == "extremes":
        Z = rng.choice(special, size=(N, H)).view(dtype)
    elif kind == "bits":  # uniformly random bit patterns: every class of float, NaN payloads included
        Z = rng.integers(0, np.iinfo(U).max, size=(N, H), dtype=U, endpoint=True).view(dtype)
    else:
        raise ValueError(kind)
    return np.ascontiguousarray(Z, dtype=dtype)


def ks_for(H: int, rng: np.random.Generator) -> list[int]:
    ks = {1, 2, H // 3 + 1, H - 1, H, int(rng.integers(1, H + 1))}
    return sorted(k for k in ks if 1 <= k <= H)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(UINT[a.dtype])


def _first_bad_row(got: np.ndarray, want: np.ndarray) -> int:
    bad = np.nonzero((got != want).reshape(got.shape[0], -1).any(axis=1))[0]
    return int(bad[0]) if len(bad) else -1


def _mismatch(label: str, what: str, got, want, Z) -> Mismatch:
    n = _first_bad_row(got, want)
    return Mismatch(f"{label}: {what} differs from the reference in row {n} of {got.shape[0]}\n"
                    f"  got  {got[n][:12]}\n  want {want[n][:12]}\n  row bits {bits(Z[n])[:12]}")


# ------------------------------------------------------------------------------------------------
# Running plans through the emulation.

def block_of(name: str) -> int:
    return int(re.search(r", (\d+)>", name).group(1))


def run_topk(driver: harness.Driver, Z: np.ndarray, k: int, method: str, *, dense: bool, schedule: harness.Schedule,
             max_blocks=None, label: str = "", instantiation: str | None = None, variant: str = "block",
             limits: kernels.DeviceLimits = LIMITS) -> int:
    """One top-k launch as topk_gpu would make it, checked against the reference; returns the rows.

    ``instantiation``: run this one instead of the one the launcher picks for H (same arguments,
    its own block size)."""
    N, H = Z.shape
    dtype = Z.dtype
    idx = np.full((N, k), -1, dtype=np.int32)
    val = np.full((N, k), POISON[dtype], dtype=UINT[dtype]).view(dtype)
    outs = (idx, val)
    if dense:
        outs += (np.full((N, H), POISON[dtype], dtype=UINT[dtype]).view(dtype),)
    plan = kernels.plan_topk(Z, k, method, outs, limits, max_blocks=max_blocks, variant=variant)
    if instantiation is not None and instantiation != plan.name:
        plan = dataclasses.replace(plan, name=instantiation, block=block_of(instantiation))
    label = f"{label} N={N} H={H} k={k} {dtype} dense={int(dense)} grid={plan.grid} {schedule}"
    driver.run(plan, schedule, label)
    ref_idx, ref_val = REFERENCE[method](Z, k)
    if not np.array_equal(np.sort(idx, axis=1), np.sort(ref_idx, axis=1)):
        raise _mismatch(label, "the kept set", np.sort(idx, axis=1), np.sort(ref_idx, axis=1), Z)
    if not np.array_equal(idx, ref_idx):
        raise _mismatch(label, "the order of the kept columns", idx, ref_idx, Z)
    if not np.array_equal(bits(val), bits(ref_val)):
        raise _mismatch(label, "the kept values (bits)", bits(val), bits(ref_val), Z)
    if dense:
        ref_dense = np.zeros_like(Z)
        np.put_along_axis(ref_dense, ref_idx, ref_val, axis=1)
        if not np.array_equal(bits(outs[2]), bits(ref_dense)):
            raise _mismatch(label, "the dense masked rows (bits)", bits(outs[2]), bits(ref_dense), Z)
    return N


def topk_cases(name: str, Hs, kinds, rows_small: int, rows_large: int, seed: int):
    """Case functions for one top-k instantiation: every H x kind x k, rotating N, grid caps,
    dense or not, and schedules."""
    method = "threshold" if "threshold" in name else "sort"
    dtype = np.float32 if "<float" in name else np.float64
    cases = []
    rng = np.random.default_rng(seed)
    i = 0
    for H in Hs:
        for kind in kinds:
            for k in ks_for(H, rng):
                N = rows_small if H <= 1024 else rows_large
                N = [N, max(1, N - 2), 1][i % 3]  # 7, 5, 1 rows (5, 3, 1 for long rows)
                Z = make_rows(kind, N, H, k, rng, dtype)
                schedule = harness.SCHEDULES[i % len(harness.SCHEDULES)]
                max_blocks = [None, 1, 3, None, 2][i % 5]  # several rows per block, and one row per block
                dense = i % 2 == 1
                label = f"{name} {kind}"
                cases.append(lambda d, Z=Z, k=k, dense=dense, s=schedule, mb=max_blocks, label=label:
                             run_topk(d, Z, k, method, dense=dense, schedule=s, max_blocks=mb, label=label,
                                      instantiation=name))
                i += 1
    return cases


def routed_Hs(name: str, Hs) -> list[int]:
    """The H values for which topk_gpu chooses this instantiation (block size by H, dtype by fit)."""
    method = "threshold" if "threshold" in name else "sort"
    dtype = np.float32 if "<float" in name else np.float64
    out = []
    for H in Hs:
        if kernels.topk_kernel_name(method, dtype, H) != name:
            continue
        if kernels.topk_shared_bytes(method, H, dtype) + kernels.STATIC_SHARED_BYTES[method] > LIMITS.shared_optin:
            continue
        out.append(H)
    return out


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    exe = harness.build(tmp_path_factory.mktemp("cuda_host"), kernels.kernel_source_path(), kernels.KERNEL_NAMES)
    p = harness.DriverPool(exe, JOBS)
    yield p
    p.close()


def _report(pool, before: dict, t0: float, what: str) -> dict:
    after = pool.rows()
    rows = {n: after.get(n, 0) - before.get(n, 0) for n in after if after.get(n, 0) != before.get(n, 0)}
    print(f"\n{what}: {time.perf_counter() - t0:.1f} s")
    for n, r in sorted(rows.items()):
        print(f"  {n}: {r} rows compared")
    return rows


TOPK_NAMES = [n for n in kernels.KERNEL_NAMES if "topk_" in n and "topk_radix" not in n]
RADIX_NAMES = [n for n in kernels.KERNEL_NAMES if "topk_radix" in n]
ROW_NAMES = [n for n in kernels.KERNEL_NAMES if "_rows_kernel" in n]


def test_every_instantiation_is_covered():
    assert set(TOPK_NAMES) | set(RADIX_NAMES) | set(ROW_NAMES) == set(kernels.KERNEL_NAMES)
    for name in TOPK_NAMES:
        assert routed_Hs(name, H_SMALL + H_LARGE), f"no H of the case list routes to {name}"


# ------------------------------------------------------------------------------------------------
# Top-k.

@pytest.mark.parametrize("name", TOPK_NAMES)
def test_topk_instantiation_matches_reference(pool, name):
    """The H values the launcher sends to this instantiation, every kind of hard row, k from 1 to
    H, plus a few H it is not chosen for (an instantiation must be right for any H)."""
    t0, before = time.perf_counter(), pool.rows()
    Hs = routed_Hs(name, H_SMALL + H_LARGE)
    small = [H for H in Hs if H <= 1024]
    large = [H for H in Hs if H > 1024]
    cases = topk_cases(name, small, KINDS, rows_small=7, rows_large=5, seed=len(name))
    cases += topk_cases(name, [H for H in large if H < 8000], KINDS, rows_small=7, rows_large=5, seed=1)
    # The longest rows (8,191 to 16,384) cost the most to emulate: half the kinds here, all under -m slow.
    cases += topk_cases(name, [H for H in large if H >= 8000], ("random", "equal", "kth_ties", "nan", "bits"),
                        rows_small=7, rows_large=5, seed=3)
    other = [H for H in (31, 1000, 4097) if H not in Hs]
    cases += topk_cases(name, other, ("random", "kth_ties"), rows_small=5, rows_large=2, seed=2)
    pool.map(cases)
    rows = _report(pool, before, t0, name)
    assert rows.get(name, 0) >= 1000


@pytest.mark.slow
@pytest.mark.parametrize("name", TOPK_NAMES)
def test_topk_instantiation_every_H_every_kind(pool, name):
    """Every instantiation on every H (routed or not, as far as shared memory allows) and every kind."""
    t0, before = time.perf_counter(), pool.rows()
    method = "threshold" if "threshold" in name else "sort"
    dtype = np.float32 if "<float" in name else np.float64
    Hs = [H for H in H_SMALL + H_LARGE
          if kernels.topk_shared_bytes(method, H, dtype) + kernels.STATIC_SHARED_BYTES[method] <= LIMITS.shared_optin]
    pool.map(topk_cases(name, Hs, KINDS, rows_small=12, rows_large=3, seed=7 + len(name)))
    rows = _report(pool, before, t0, name)
    assert rows.get(name, 0) >= 5000


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_topk_threshold_longest_rows(pool, dtype):
    """The longest row the threshold kernel takes on a 227 KiB GPU, with k = 1, a tie run, and k = H."""
    H = kernels.topk_max_H("threshold", dtype, LIMITS.shared_optin, kernels.STATIC_SHARED_BYTES["threshold"])
    rng = np.random.default_rng(3)
    name = kernels.topk_kernel_name("threshold", dtype, H)
    cases = [lambda d, Z=make_rows(kind, 2, H, k, rng, dtype), k=k, s=s, kind=kind:
             run_topk(d, Z, k, "threshold", dense=s.data_at_end, schedule=s, label=f"{name} {kind}")
             for kind, k, s in [("random", 1, harness.SCHEDULES[0]), ("kth_ties", 777, harness.SCHEDULES[4]),
                                ("bits", H, harness.SCHEDULES[2])]]
    pool.map(cases)
    # One more row would not fit: the plan refuses it with the limit in the message.
    Z = np.zeros((1, H + 1), dtype=dtype)
    with pytest.raises(kernels.KsaeError, match=f"H <= {H}"):
        kernels.plan_topk(Z, 1, "threshold", (np.empty((1, 1), np.int32), np.empty((1, 1), dtype)), LIMITS)


# ------------------------------------------------------------------------------------------------
# The radix kernels (one warp per row): every path of the launch plan and of the kernel.

# A device with 64 KiB of opt-in shared memory: H = 16,384 (float32) and H = 8,191 (float64) no
# longer fit in one warp's cache, so those rows take the path that re-reads the row per digit.
SMALL_SHARED = kernels.DeviceLimits(sm_count=4, shared_optin=64 * 1024)


def radix_cases(name: str, seed: int):
    """(H, k, kind, N, limits) covering: several rows per block (small H, N above 256), one row per
    block (N small), the key cache and the uncached path, 16-byte vector loads (H a multiple of the
    vector) and scalar loads (H odd), k in {1, 25, 150, H - 1, H}, ties, NaN, every schedule."""
    method = "sort" if "true>" in name else "threshold"
    dtype = np.float32 if "<float" in name else np.float64
    rng = np.random.default_rng(seed)
    shapes = [  # H, ks, kinds, N, limits
        (1, (1,), ("random", "nan"), 5, LIMITS),
        (37, (1, 25, 36, 37), ("ties", "nan", "kth_ties", "bits"), 7, LIMITS),
        (100, (1, 25, 99), ("random", "equal", "zeros", "inf"), 300, LIMITS),  # 2 warps a block
        (1000, (1, 25, 150, 999), ("random", "kth_ties", "nan", "bits"), 9, LIMITS),
        (1001, (25, 150, 1000), ("ties", "subnormal", "extremes"), 5, LIMITS),  # scalar loads
        (4000, (25, 150, 3999), ("random", "kth_ties", "nan"), 3, LIMITS),
        (16384, (1, 150, 16383), ("random", "kth_ties", "nan"), 2, SMALL_SHARED),  # uncached in float32
        (8191, (25, 8190), ("bits", "ties"), 2, SMALL_SHARED),  # uncached in float64, scalar loads
        (65536, (25, 1000, 65535), ("random", "kth_ties"), 1, LIMITS),  # beyond any cache: the grid's longest rows
    ]
    cases = []
    i = 0
    for H, ks, kinds, N, limits in shapes:
        for kind in kinds:
            for k in ks:
                if k > H or (method == "sort" and next_pow2(k) * (dtype(0).itemsize + 4) > limits.shared_optin - 8192):
                    continue  # the sort's k kept pairs do not fit (test_radix_layout_covers_each_path)
                Z = make_rows(kind, N, H, k, rng, dtype)
                schedule = harness.SCHEDULES[i % len(harness.SCHEDULES)]
                max_blocks = [None, 1, 2][i % 3]
                dense = i % 2 == 1
                cases.append(lambda d, Z=Z, k=k, dense=dense, s=schedule, mb=max_blocks, lim=limits:
                             run_topk(d, Z, k, method, dense=dense, schedule=s, max_blocks=mb, label=name,
                                      variant="radix", limits=lim))
                i += 1
    return cases


def test_radix_layout_covers_each_path():
    """The launch plans the radix cases rely on: rows per block, key cache on and off."""
    f32, f64 = np.float32, np.float64
    small = kernels.radix_layout("threshold", 1000, 25, f32, LIMITS.shared_optin, N=4096)
    assert small.warps == 8 and small.cache_keys and small.region_bytes == 4000
    assert kernels.radix_layout("threshold", 1000, 25, f32, LIMITS.shared_optin, N=100).warps == 1
    assert kernels.radix_layout("threshold", 100, 25, f32, LIMITS.shared_optin, N=300).warps == 2
    assert not kernels.radix_layout("threshold", 16384, 150, f32, SMALL_SHARED.shared_optin).cache_keys
    assert not kernels.radix_layout("threshold", 8191, 25, f64, SMALL_SHARED.shared_optin).cache_keys
    # H = 65,536 in float32 does not fit one warp's cache on any GPU: it runs uncached.
    big = kernels.radix_layout("sort", 65536, 1000, f32, LIMITS.shared_optin, N=4096)
    assert not big.cache_keys and big.P == 1024 and big.region_bytes == 1024 * 8
    with pytest.raises(kernels.KsaeError, match="k=65535 is too large"):
        kernels.radix_layout("sort", 65536, 65535, f32, SMALL_SHARED.shared_optin)


@pytest.mark.parametrize("name", RADIX_NAMES)
def test_radix_instantiation_matches_reference(pool, name):
    t0, before = time.perf_counter(), pool.rows()
    pool.map(radix_cases(name, seed=len(name)))
    rows = _report(pool, before, t0, name)
    assert rows.get(name, 0) >= 300


@pytest.mark.slow
@pytest.mark.parametrize("method", ["threshold", "sort"])
def test_topk_twenty_thousand_rows(pool, method):
    """N = 20,011 rows on the launcher's own grid (1,056 blocks): about 19 rows per block, in one launch."""
    rng = np.random.default_rng(11)
    Z = make_rows("ties", 20_011, 48, 5, rng, np.float32)
    pool.map([lambda d: run_topk(d, Z, 5, method, dense=True, schedule=harness.SCHEDULES[2], label="many rows")])


# ------------------------------------------------------------------------------------------------
# Gathers, scatters, masks.

def run_rows(driver, kind: str, src, idx, H: int, schedule, label: str) -> int:
    N, k = idx.shape
    dtype = src.dtype
    r, c = np.nonzero((idx >= 0) & (idx < H))  # the entries with a valid column
    src_bits = bits(src)
    if kind == "gather":
        out = np.full((N, k), POISON[dtype], UINT[dtype]).view(dtype)
        want = np.zeros((N, k), dtype=UINT[dtype])
        want[r, c] = src_bits[r, idx[r, c]]
    else:
        out = np.full((N, H), POISON[dtype], UINT[dtype]).view(dtype)  # the launcher zeroes it first
        want = np.zeros((N, H), dtype=UINT[dtype])
        want[r, idx[r, c]] = src_bits[r, c] if kind == "scatter" else src_bits[r, idx[r, c]]
    want = want.view(dtype)
    plan = kernels.plan_rows(kind, src, idx, out, LIMITS)
    label = f"{label} N={N} H={H} k={k} {dtype} grid={plan.grid} {schedule}"
    driver.run(plan, schedule, label)
    if not np.array_equal(bits(out), bits(want)):
        raise _mismatch(label, "the output (bits)", bits(out), bits(want), src)
    return N


def row_cases(name: str, shapes, seed: int):
    kind = re.search(r"ksae::(\w+)_rows_kernel", name).group(1)
    dtype = np.float32 if "<float>" in name else np.float64
    rng = np.random.default_rng(seed)
    cases = []
    for i, (N, H, k) in enumerate(shapes):
        # Distinct columns per row (top-k indices never repeat), and some outside [0, H), which
        # every kernel must skip.
        idx = np.argsort(rng.random((N, H)), axis=1)[:, :k].astype(np.int32)
        bad = rng.random((N, k)) < 0.1
        idx[bad] = rng.choice(np.array([-1, H, -(2**31), 2**31 - 1], dtype=np.int64), size=int(bad.sum()))
        src = make_rows("bits", N, k if kind == "scatter" else H, 1, rng, dtype)
        s = harness.SCHEDULES[i % len(harness.SCHEDULES)]
        cases.append(lambda d, src=src, idx=idx, H=H, s=s: run_rows(d, kind, src, idx, H, s, name))
    return cases


ROW_SHAPES = [(1, 1, 1), (7, 31, 5), (13, 1000, 25), (37, 257, 257), (1009, 100, 3), (3, 16384, 512), (4099, 17, 16)]


@pytest.mark.parametrize("name", ROW_NAMES)
def test_rows_instantiation_matches_reference(pool, name):
    t0, before = time.perf_counter(), pool.rows()
    pool.map(row_cases(name, ROW_SHAPES, seed=len(name)))
    rows = _report(pool, before, t0, name)
    assert rows.get(name, 0) == sum(N for N, _, _ in ROW_SHAPES)


def test_rows_million_rows(pool):
    """N = 10^6 rows, k = 1: the launcher's grid (4,224 blocks of 256 threads) strides over them."""
    rng = np.random.default_rng(5)
    N, H = 1_000_000, 3
    idx = rng.integers(0, H, size=(N, 1), dtype=np.int32)
    src = rng.standard_normal((N, H)).astype(np.float32)
    pool.map([lambda d: run_rows(d, "mask", src, idx, H, harness.SCHEDULES[1], "million rows")])


# ------------------------------------------------------------------------------------------------
# The harness fails when a kernel is wrong: bugs planted in copies of the source.

# (name, text in select_topk.cu, replacement, what to run, kind). Kind "race": a barrier between two
# phases removed, which only shows when a warp may run ahead (the warps-* schedules); "equivalent":
# a change that cannot alter any answer, so no test can catch it (kept to show the harness does not
# flag correct code).
PLANTED = [
    ("tie off-by-one", "const bool keep = is_above || (is_tie && ties_before < need);",
     "const bool keep = is_above || (is_tie && ties_before <= need);", "threshold", "logic"),
    ("missing __syncthreads", "    if (lane == 31) warp_sums[warp] = x;\n    __syncthreads();",
     "    if (lane == 31) warp_sums[warp] = x;", "threshold", "race"),
    ("partial warp mask", "const unsigned int y = __shfl_up_sync(0xffffffffu, x, offset);",
     "const unsigned int y = __shfl_up_sync(0x7fffffffu, x, offset);", "threshold", "warp"),
    ("out-of-bounds dynamic shared write", "for (int j = threadIdx.x; j < P; j += BLOCK) {",
     "for (int j = threadIdx.x; j <= P; j += BLOCK) {", "sort", "bounds"),
    ("out-of-bounds static shared write", "for (int b = threadIdx.x; b < 256; b += BLOCK) hist[b] = 0u;",
     "for (int b = threadIdx.x; b <= 256; b += BLOCK) hist[b] = 0u;", "threshold", "bounds"),
    ("wrong key transform for negative values",
     "const unsigned int flip = static_cast<unsigned int>(static_cast<int>(u) >> 31) | 0x80000000u;",
     "const unsigned int flip = (u >> 31) | 0x80000000u;", "sort", "logic"),
    ("row loop skips rows", "for (long long row = blockIdx.x; row < N; row += gridDim.x) {\n"
     "        const T* z = Z + row * static_cast<long long>(H);\n        for (int j = threadIdx.x; j < H; j += BLOCK) keys",
     "for (long long row = blockIdx.x; row < N; row += gridDim.x + 1) {\n"
     "        const T* z = Z + row * static_cast<long long>(H);\n        for (int j = threadIdx.x; j < H; j += BLOCK) keys",
     "threshold", "logic"),
    ("mask kernel writes column H", "op(t, t / k * H, c, c >= 0 && c < H);", "op(t, t / k * H, c, c >= 0 && c <= H);",
     "mask", "bounds"),
    ("mask kernel row offset t / H * H", "op(t, t / k * H, c, c >= 0 && c < H);",
     "op(t, t / H * H, c, c >= 0 && c < H);", "mask", "logic"),
    ("block scan's final __syncthreads removed (warp_sums reused by the next call)",
     "    r.total = warp_sums[WARPS - 1];\n    __syncthreads();", "    r.total = warp_sums[WARPS - 1];", "threshold", "race"),
    ("block scan's middle __syncthreads removed (per-warp prefixes read before written)",
     "        if (lane < WARPS) warp_sums[lane] = s;  // inclusive per-warp prefix\n    }\n    __syncthreads();",
     "        if (lane < WARPS) warp_sums[lane] = s;  // inclusive per-warp prefix\n    }", "threshold", "race"),
    ("threshold: __syncthreads after the digit pick removed",
     "                s_bin = count;\n            }\n            __syncthreads();",
     "                s_bin = count;\n            }", "threshold", "race"),
    ("threshold: __syncthreads after loading keys and clearing the histogram removed",
     "            __syncthreads();  // keys loaded (first pass), histogram cleared", "", "threshold", "race"),
    ("sort: end-of-row __syncthreads removed (the next row overwrites keys and cols)",
     "        __syncthreads();  // the next row overwrites keys and cols", "", "sort", "race"),
    ("sort: __syncthreads after the key load removed",
     "                cols[j] = 0x7fffffff;\n            }\n        }\n        __syncthreads();",
     "                cols[j] = 0x7fffffff;\n            }\n        }", "sort", "race"),
    ("sort: __syncthreads between bitonic stages removed",
     "                }\n                __syncthreads();\n            }", "                }\n            }", "sort", "race"),
    ("digit pick need < above + count", "above < need && need <= above + count", "above < need && need < above + count",
     "threshold", "logic"),
    ("emit loop stops at kept + 1 >= k", "if (!write_dense && kept >= static_cast<unsigned int>(k)) break;",
     "if (!write_dense && kept + 1 >= static_cast<unsigned int>(k)) break;", "threshold", "logic"),
    ("emit loop stops early while writing the dense row",
     "if (!write_dense && kept >= static_cast<unsigned int>(k)) break;",
     "if (kept >= static_cast<unsigned int>(k)) break;", "threshold", "logic"),
    ("sort: ties by descending column", "return ka > kb || (ka == kb && ia < ib);",
     "return ka > kb || (ka == kb && ia > ib);", "sort", "logic"),
    ("NaN key test off by one (+inf taken for NaN)", "if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;",
     "if ((u & 0x7fffffffu) >= 0x7f800000u) return 0u;", "threshold", "logic"),
    ("threshold: key load reads column H", "for (int j = threadIdx.x; j < H; j += BLOCK) keys[j] = KeyTraits<T>::to_key(z[j]);",
     "for (int j = threadIdx.x; j <= H; j += BLOCK) keys[j] = KeyTraits<T>::to_key(z[j]);", "threshold", "bounds"),
    ("digit pick above <= need", "above < need && need <= above + count", "above <= need && need <= above + count",
     "threshold", "equivalent"),
    ("radix: __syncwarp after the top-digit load removed",
     "                atomicAdd(&hist[static_cast<unsigned int>(key >> (BITS - 8)) & 0xffu], 1u);\n            }\n"
     "        }\n        __syncwarp(0xffffffffu);",
     "                atomicAdd(&hist[static_cast<unsigned int>(key >> (BITS - 8)) & 0xffu], 1u);\n            }\n        }",
     "radix_threshold", "race"),
    ("radix: tie off-by-one", "const bool keep = (is_tie && ties_before < need) || is_above;",
     "const bool keep = (is_tie && ties_before <= need) || is_above;", "radix_threshold", "logic"),
    ("radix: the uncached path reads the (unwritten) cache", "return cached ? keys[j] : KeyTraits<T>::to_key(z[j]);",
     "return (cached || z != nullptr) ? keys[j] : keys[j];", "radix_threshold", "logic"),
    ("radix: vector load caches half the vectors", "if (cached) reinterpret_cast<Vec16<Key>*>(keys)[q] = kv;",
     "if (cached) reinterpret_cast<Vec16<Key>*>(keys)[q / 2] = kv;", "radix_threshold", "logic"),
    ("radix: digit pick need - above < count", "need > above && need - above <= count",
     "need > above && need - above < count", "radix_threshold", "logic"),
    ("radix: __syncwarp between bitonic stages removed",
     "                    }\n                    __syncwarp(0xffffffffu);\n                }",
     "                    }\n                }", "radix_sort", "race"),
    ("radix: __syncwarp before the sort reloads the kept entries removed",
     "            __syncwarp(0xffffffffu);  // the emit's reads of keys and writes of idx_row/val_row are done",
     "", "radix_sort", "race"),
]
PLANTED_NAMES = ["ksae::topk_threshold_kernel<float, 256>", "ksae::topk_sort_kernel<float, 256>",
                 "ksae::topk_radix_kernel<float, false>", "ksae::topk_radix_kernel<float, true>",
                 "ksae::mask_rows_kernel<float>"]
# A device whose shared memory caches rows of up to 512 float32 keys per warp: the radix cases below
# run both the cached and the uncached path.
TINY_SHARED = kernels.DeviceLimits(sm_count=2, shared_optin=8192 + 2048)


@pytest.fixture(scope="module")
def planted_driver(tmp_path_factory):
    """One driver holding every planted version of the source, version i in namespace bug<i>, and
    the source as it is in namespace original."""
    source = kernels.kernel_source()
    root = tmp_path_factory.mktemp("planted")
    variants = [("original", kernels.kernel_source_path())]
    for i, (name, old, new, _, _) in enumerate(PLANTED):
        assert source.count(old) == 1, f"the anchor of planted bug {name!r} is not in select_topk.cu exactly once"
        path = root / f"bug{i}" / "select_topk.cu"
        path.parent.mkdir()
        path.write_text(source.replace(old, new))
        variants.append((f"bug{i}", path))
    # The instantiations the planted cases run; -O1 builds faster and these cases are few.
    return harness.build_variants(root, variants, PLANTED_NAMES, optimize="-O1")


def _planted_cases(what: str):
    """Small rows of every kind that matters (ties at the k-th value, NaN, +/-inf), k = 1, 5, H,
    two blocks for several rows each, dense and not, across every schedule."""
    rng = np.random.default_rng(9)
    if what == "mask":
        name = "ksae::mask_rows_kernel<float>"
        return row_cases(name, [(7, 31, 5), (13, 100, 9)], seed=3)
    cases = []
    method, variant = (what[len("radix_"):], "radix") if what.startswith("radix_") else (what, "block")
    for H, kind, N in [(31, "kth_ties", 7), (100, "random", 9), (257, "ties", 5), (1000, "nan", 3), (300, "inf", 4),
                       (800, "kth_ties", 3), (64, "ties", 20)]:
        Z = make_rows(kind, N, H, 5, rng, np.float32)
        for k in (1, 5, H):
            i = len(cases)
            s = harness.SCHEDULES[i % len(harness.SCHEDULES)]
            # The radix kernel on the tiny device too: rows longer than 512 run uncached there.
            limits = TINY_SHARED if variant == "radix" and i % 2 == 0 and not (method == "sort" and k > 256) else LIMITS
            cases.append(lambda d, Z=Z, k=k, s=s, dense=i % 2 == 1, lim=limits:
                         run_topk(d, Z, k, method, dense=dense, schedule=s, max_blocks=2, label="planted",
                                  variant=variant, limits=lim))
    return cases


def _run_planted(exe, i: int) -> str | None:
    """Runs planted bug i's cases; the first line of the report that caught it, or None."""
    driver = harness.Driver(exe, prefix=f"bug{i}::")
    try:
        for case in _planted_cases(PLANTED[i][3]):
            case(driver)
    except (harness.HarnessError, Mismatch) as caught:
        report = [line for line in str(caught).splitlines() if "runtime error" in line or line.startswith("cuda_host:")]
        return (report or str(caught).splitlines())[0]
    finally:
        driver.close()
    return None


def test_planted_bugs_are_caught(planted_driver):
    """Every planted bug that can change an answer fails the harness, races included; the
    catch rate is printed (``-rP``) with the report that caught each."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(JOBS) as ex:
        reports = list(ex.map(lambda i: _run_planted(planted_driver, i), range(len(PLANTED))))
    real = [i for i, p in enumerate(PLANTED) if p[4] != "equivalent"]
    caught = [i for i in real if reports[i] is not None]
    print(f"\nplanted bugs caught: {len(caught)} of {len(real)} that can change an answer "
          f"({len(PLANTED) - len(real)} equivalent, not counted)")
    for (name, _, _, what, kind), report in zip(PLANTED, reports):
        print(f"  [{kind}] {name} ({what}): {'CAUGHT: ' + report if report else 'not caught'}")
    missed = [PLANTED[i][0] for i in real if reports[i] is None]
    assert not missed, f"planted bugs not caught: {missed}"


def test_planted_cases_pass_on_the_unmodified_source(planted_driver):
    """The control: the same cases on the same driver pass without a planted bug, so each catch
    above is the bug's doing."""
    pool = harness.DriverPool(planted_driver, 1, prefix="original::")
    try:
        for what in sorted({p[3] for p in PLANTED}):
            assert sum(pool.map(_planted_cases(what))) > 0
    finally:
        pool.close()
