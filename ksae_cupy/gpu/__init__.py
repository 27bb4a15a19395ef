"""The algorithm's CUDA half: launchers of the kernels in ``kernels/*.cu`` and the steps built on them.

``cuda_kernels.py`` launches the top-k, gather, scatter and mask kernels (same contract as the NumPy
functions in :mod:`ksae_cupy.topk`, which dispatch CuPy arrays here); ``graph_epoch.py`` is the
trainer's epoch on a GPU as one CUDA graph, on the steps of ``graph_step.py`` (and ``graph_auxk.py`` for
AuxK; alone, they are the step graphs between cuBLAS products, kept to compare) with the product and
loss-sum kernels of ``products.py`` and the epoch's order drawn by ``shuffle.py`` (the sources:
``kernels/select_topk.cu``, ``step_products.cu`` and ``draw_order.cu``). Nothing here imports cupy at
module load.

May import: the top-level algorithm modules (errors, backend, model, topk). Imported by the
top-level :mod:`ksae_cupy.topk` (lazily, for CuPy arrays) and by everything above.
"""
