"""The algorithm's CUDA half: launchers of the kernels in ``kernels/*.cu`` and the step built on them.

``cuda_kernels.py`` launches the top-k, gather, scatter and mask kernels (same contract as the NumPy
functions in :mod:`ksae_cupy.topk`, which dispatch CuPy arrays here); ``fused_step.py`` is a
training step built on them, timed by ``ksae-bench gpu`` only (no trainer takes it). Nothing
here imports cupy at module load.

May import: the top-level algorithm modules (errors, backend, model, topk). Imported by the
top-level :mod:`ksae_cupy.topk` (lazily, for CuPy arrays) and by everything above.
"""
