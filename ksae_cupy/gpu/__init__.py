"""The algorithm's CUDA half: launchers of the kernels in ``kernels/*.cu`` and the steps built on them.

``cuda_kernels.py`` launches the top-k, gather, scatter and mask kernels (same contract as the NumPy
functions in :mod:`ksae_cupy.topk`, which dispatch CuPy arrays here); ``graph_step.py`` (and
``graph_auxk.py`` for AuxK) is the trainer's step on a GPU, captured as CUDA graphs and replayed per
batch; ``fused_step.py`` is an earlier step built on the kernels, timed by ``ksae-bench gpu`` only
(no trainer takes it). Nothing here imports cupy at module load.

May import: the top-level algorithm modules (errors, backend, model, topk). Imported by the
top-level :mod:`ksae_cupy.topk` (lazily, for CuPy arrays) and by everything above.
"""
