"""Recipes: the mains of the scripts under ``bin/``, each a sequence of the project's commands or benchmarks.

``reproduce_mnist.py`` (``bin/reproduce-mnist``: the k-sparse rows of Table err_mnist),
``reproduce_finetune.py`` (``bin/reproduce-finetune``: Table fn_mnist's rows as resumable steps, each a
command in a child process) with ``finetune_table.py`` (its rows, their folders and the table from them),
``paper_tables_script.py`` (``bin/paper-tables``: its options and run over :mod:`ksae_cupy.reports.paper_tables`),
``campaign.py`` and ``campaign_stages.py`` (``bin/gpu-campaign``: a lent GPU machine's checks, benchmarks and
runs), ``baseline_grid.py`` (``bin/baseline-grid``: the baselines' learning rate and weight decay),
``train_pack.py`` (``bin/train-pack``: several ksae-train runs in one launch), ``dead_units_table.py`` and
``fashion_mnist_table.py`` (their tables from run folders), ``bench_auxk.py`` and ``measure_lr.py``
(``bin/bench-auxk``'s and ``bin/measure-lr``'s options over :mod:`ksae_cupy.bench`) and ``script.py`` (a
script's mistake as one ``error:`` line, exit status 2).

May import: everything but :mod:`ksae_cupy.cli` (the commands run as child processes).
"""
