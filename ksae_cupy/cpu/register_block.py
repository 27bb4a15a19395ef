"""A block of running sums the compiler can keep in vector registers: a small array on the stack.

The encoder from the non-zero inputs (:mod:`ksae_cupy.cpu.sparse_encoder`) adds a row of its tile of
``W`` into an example's running sums once per non-zero input, :data:`BLOCK` values at a time. Kept in
a NumPy array, the sums are loaded and stored on every pass: the compiler cannot prove that the
array is not one of the rows it reads. On the stack, where nothing else can point, and indexed only
by constants (loops of exactly :data:`BLOCK` steps, which the compiler unrolls), they stay in
registers for the whole loop (checked in the kernel's assembly; the same bits, since each value's
sum keeps its order).

Serial builds only: in a trial, Numba's parallel (``prange``) build of a kernel holding one ran 6x
slower than its serial build; the kernels that hold one share their work in lanes
(:mod:`ksae_cupy.cpu.lanes`) instead.

``register_block(like)`` returns such an array of :data:`BLOCK` values of ``like``'s type, not
initialised. Only kernels use it: :func:`ksae_cupy.cpu.numba_kernels._compiled` binds the compiled
function into a kernel's module under the name ``register_block`` before compiling it.
"""
from __future__ import annotations

import functools

BLOCK = 128  # values per block: 8 AVX-512 (16 AVX2) registers of float32


@functools.cache
def compiled_register_block(numba):
    """``register_block(like)`` compiled for ``numba`` (made once, when the first kernel is compiled)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def stack_block(typingctx, like):
        def codegen(context, builder, signature, args):
            value_type = context.get_value_type(like)
            # In the function's entry block: one slot per call site, whatever loop it sits in.
            slot = cgutils.alloca_once(builder, ir.ArrayType(value_type, BLOCK))
            return builder.bitcast(slot, value_type.as_pointer())
        return types.CPointer(like)(like), codegen

    carray = numba.carray

    @numba.njit(inline="always")
    def register_block(like):
        return carray(stack_block(like), (BLOCK,))

    return register_block
