"""The GPU's epoch order (kernels/draw_order.cu) against NumPy's ``Generator.permutation``, bit for bit.

The unmodified kernel runs in the host emulator (tests/gpu/cuda_host), launched by the plan of
ksae_cupy.gpu.shuffle, under several schedules: the order and the generator's state after it must
be NumPy's, in shared memory (N <= 65,536) and in global memory (larger N, or a device with less
shared memory), from generators with and without a buffered 32-bit half.
"""
from __future__ import annotations

import numpy as np
import pytest

from ksae_cupy.errors import KsaeError
from ksae_cupy.gpu import cuda_kernels, shuffle

import emulated_kernels
from emulated_kernels import harness

pytestmark = emulated_kernels.needs_compiler

H100 = cuda_kernels.DeviceLimits(sm_count=132, shared_optin=227 * 1024)
SMALL = cuda_kernels.DeviceLimits(sm_count=8, shared_optin=48 * 1024)  # 60,000 rows do not fit: global memory


driver = emulated_kernels.driver_fixture(shuffle)


def generator(seed: int, odd: bool):
    """A generator mid-run; ``odd``: with a 32-bit half buffered (has_uint32 set)."""
    rng = np.random.default_rng(seed)
    rng.random(3)
    if odd:
        rng.integers(0, 2 ** 31, dtype=np.int32)  # draws one 32-bit half of a 64-bit output
    return rng


@pytest.mark.parametrize("N, limits", [(1, H100), (2, H100), (50, H100), (1000, H100), (60000, H100),
                                       (65536, H100), (65537, H100), (60000, SMALL)])
def test_the_order_and_the_state_after_it_are_numpys(driver, N, limits):
    for i, odd in enumerate((False, True)):
        rng = generator(N + i, odd)
        assert bool(rng.bit_generator.state["has_uint32"]) == odd
        words = shuffle.state_words(rng.bit_generator.state)
        order = np.full(N, -1, dtype=np.int64)
        plan = shuffle.plan_permutation(order, words, limits)
        assert (plan.shared_mem > 0) == (N <= 65536 and 2 * N <= limits.shared_optin)
        driver.run(plan, schedule=harness.SCHEDULES[(N + i) % len(harness.SCHEDULES)])
        np.testing.assert_array_equal(order, rng.permutation(N))
        assert shuffle.state_from_words(words) == rng.bit_generator.state


def test_the_state_words_round_trip_and_refuse_other_generators():
    state = generator(3, True).bit_generator.state
    assert shuffle.state_from_words(shuffle.state_words(state)) == state
    with pytest.raises(KsaeError, match="MT19937"):
        shuffle.state_words(np.random.Generator(np.random.MT19937(0)).bit_generator.state)


def test_a_missing_barrier_is_caught(tmp_path):
    def answers_right(d, schedule) -> bool:
        rng = generator(1, False)
        words, order = shuffle.state_words(rng.bit_generator.state), np.zeros(500, dtype=np.int64)
        d.run(shuffle.plan_permutation(order, words, H100), schedule=schedule)
        return np.array_equal(order, rng.permutation(500))

    bad = emulated_kernels.build(tmp_path, shuffle, planted=("__syncthreads();  // the shuffle is done", ""))
    assert emulated_kernels.runs_wrong(bad, answers_right)
