"""Training over several processes: MPI data parallelism, hidden units sharded over ranks with
their distributed top-k, the communicators and the traffic formulas, and Dask sweeps.

``data_parallel.py`` (the DP trainer), ``distributed_run.py`` (``run_distributed``: an MPI job's run,
through the session's run lifecycle; rank 0 writes), ``resume.py`` (its --resume), ``sharded_hidden.py`` (W's columns
split over ranks), ``sharded_topk.py`` (top-k across shards: counts only, or gather), ``comm.py``
(MPI / NCCL all-reduce, shard bounds), ``commvolume.py`` (bytes per step, by formula and counted),
``sweep.py`` (a grid of runs on Dask workers, or packed), ``sweep_options.py`` (ksae-sweep's options read), ``agree.py`` (how an MPI job fails: checks agreed
over the ranks, one line, every rank leaving together). mpi4py and dask are imported inside functions.

May import: the algorithm, gpu, datasets, training, session, evaluation.
"""
