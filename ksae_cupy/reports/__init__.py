"""What reports are made of: run folders read, tables written, the commands that fill a missing row.

``folders.py`` (a run folder's state: epochs asked and done, seconds, eval.json or finetune.json,
read-only), ``markdown.py`` (tables, percentages, durations, mean and spread over seeds),
``children.py`` (the project's commands as child processes, one at a time, signals passed on),
``paper_tables.py`` (Tables err_mnist and fn_mnist built from run folders beside the paper's
figures of :mod:`ksae_cupy.paper`; the commands that make a missing row) and ``kept_checkpoints.py``
(the checkpoints of committed runs kept in git history, ``ksae-data restore-checkpoint``). The scripts'
mains that use them are :mod:`ksae_cupy.recipes`.

May import: everything but :mod:`ksae_cupy.cli` and :mod:`ksae_cupy.recipes`.
"""
