"""The algorithm's CPU kernels: the sparse step's loops, compiled by Numba (the ``fast`` extra).

NumPy cannot fuse a gather, a dot product and a scatter; after the encoder product those
are all the sparse step does, so on the CPU its time goes to temporaries and passes over
memory. ``numba_kernels.py`` holds the few loops, written once in plain Python and compiled with
``numba.njit``: the decoder and the gradient at the kept units in one pass per row, the
weight gradient as a scatter of rows, and the momentum update in one pass. ``finetune_kernels.py``
holds the same kind of loops for the sparse fine-tuning step
(:mod:`ksae_cupy.supervised.sparse_finetune`), compiled the same way. ``momentum.py`` holds the
momentum updates built on them (one pass per array; the sparse step's weight gradient row by
row), which the trainers choose once instead of :class:`ksae_cupy.momentum_sgd.MomentumSGD`'s plain one.
``sparse_encoder.py`` computes ``X W + b`` from each example's non-zero inputs (a set's CSR form,
built once per run) where the inputs are sparse enough to beat BLAS's product.
Without Numba every caller keeps its NumPy/SciPy path (:func:`numba_kernels.available` says which runs).

May import: the top-level algorithm modules. Imported by :mod:`ksae_cupy.sparse_step` and
:mod:`ksae_cupy.auxk_step`, and by everything above.
"""
