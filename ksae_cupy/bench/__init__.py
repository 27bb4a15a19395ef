"""Benchmarks: each validates against the NumPy reference before it times, and records device,
versions, commit and date with every figure (``metadata.py``).

``train_cpu.py`` (a training step against its matrix products), ``finetune_cpu.py`` (the dense
and the sparse fine-tuning step), ``gpu.py`` (top-k kernels against CuPy's, PyTorch's and RAFT's),
``train_gpu.py`` (GPU epochs of a fresh and of a trained model, ours against PyTorch's), ``trained.py`` (the
trained model both time), ``distributed.py`` (a data-parallel step, all-reduce and sharded top-k traffic),
``kernel_grid.py`` (the top-k grid in one device call), ``packed.py`` (R runs packed in one launch
against one run alone: ``ksae-bench packed`` and the campaign's stage), ``environment.py`` (a lent device
and NVRTC's compile of every kernel, checked first), ``step_compare.py`` (our GPU step against PyTorch's,
like for like, validated before it is timed), ``auxk.py`` (the AuxK step against the paper's at several dead
fractions: ``bin/bench-auxk``), ``learning_rates.py`` (the largest stable learning rate per dataset, behind
``--lr auto``: ``bin/measure-lr``).

May import: everything but :mod:`ksae_cupy.cli`.
"""
