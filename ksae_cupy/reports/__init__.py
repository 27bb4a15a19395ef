"""What the scripts under ``bin/`` share: reading run folders and writing reports from them.

``folders.py`` (a run folder's state: epochs asked and done, seconds, eval.json or finetune.json,
read-only), ``markdown.py`` (tables, percentages, durations, mean and spread over seeds),
``children.py`` (the project's commands as child processes, one at a time, signals passed on),
``paper_tables.py`` (Tables err_mnist and fn_mnist built from run folders beside the paper's
figures of :mod:`ksae_cupy.paper`; the commands that make a missing row) with ``paper_tables_script.py``
(``bin/paper-tables``: its options and run), ``campaign.py`` and
``campaign_stages.py`` (``bin/gpu-campaign``: a lent GPU machine's checks, benchmarks and runs),
``baseline_grid.py`` (``bin/baseline-grid``: the baselines' learning rate and weight decay),
``reproduce_finetune.py`` (``bin/reproduce-finetune``: Table fn_mnist's rows as resumable steps, each a
command in a child process) with ``finetune_table.py`` (its rows, their folders and the table from them),
``reproduce_mnist.py`` (``bin/reproduce-mnist``: the k-sparse rows of Table err_mnist), ``train_pack.py``
(``bin/train-pack``: several ksae-train runs in one launch), ``bench_auxk.py`` and ``measure_lr.py``
(``bin/bench-auxk``'s and ``bin/measure-lr``'s options over :mod:`ksae_cupy.bench`) and ``script.py``
(a script's mistake as one ``error:`` line, exit status 2).

May import: everything but :mod:`ksae_cupy.cli` (the commands run as child processes).
"""
