"""CUDA sources, installed as the package data of ``ksae_cupy.kernels``.

Nothing here is compiled at import: :mod:`ksae_cupy.gpu.cuda_kernels` reads the ``.cu`` files and
compiles them with ``cupy.RawModule`` on first use.
"""
