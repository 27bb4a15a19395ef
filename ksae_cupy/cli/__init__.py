"""The command line: one module per command, thin by design (parse, resolve the device, print the
resolved configuration, call the library).

``train`` (ksae-train), ``data`` (ksae-data), ``bench`` (ksae-bench), ``evaluate`` (ksae-eval),
``plot`` (ksae-plot), ``analyze`` (ksae-analyze), ``finetune`` (ksae-finetune), ``sweep``
(ksae-sweep), ``mpi_train`` (``python -m mpi4py -m ksae_cupy.cli.mpi_train``), and ``common``
(the one-line error wrapper and what the commands share).

May import: everything. Nothing imports it.
"""
