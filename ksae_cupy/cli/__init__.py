"""The command line: one module per command, thin by design (parse, resolve the device, print the
resolved configuration, call the library).

``train`` (ksae-train), ``data`` (ksae-data; ``data_runs``: its codes and export), ``bench`` (ksae-bench;
``bench_finetune``, ``bench_dist``, ``bench_gpu``: its other benchmarks), ``evaluate`` (ksae-eval),
``plot`` (ksae-plot), ``analyze`` (ksae-analyze), ``finetune`` (ksae-finetune), ``sweep``
(ksae-sweep), ``baseline`` (ksae-baseline), ``mpi_train`` (``python -m mpi4py -m ksae_cupy.cli.mpi_train``),
and what the commands share: ``common`` (the one-line error wrapper), ``options`` (click options made
from the declarations of ``session/fields.py``, their values one typed object), ``progress``, ``data_options`` (DATASET's
options), ``run_options`` (those of the commands that read a run folder), ``given_path``.

May import: everything. Nothing imports it.
"""
import os

# OpenBLAS's worker threads spin for about 2^28 cycles (~0.1 s) after each matrix product before
# they sleep. In a training step the encoder product X W is followed by the Numba kernels, whose
# threads then share the cores with those spinning ones: measured on this project's 2-core machine
# (batch 128, 784-1000, k = 25, two threads), a step with its momentum update took 5.2-6.5 ms, and
# 4.5-4.7 ms with the spin cut to 2^4 cycles. Set before any command imports NumPy (which loads
# OpenBLAS and reads it once); a value the user set is kept.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
