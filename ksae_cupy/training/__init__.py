"""Training a k-sparse autoencoder: the configuration, the trainer and its epoch loop, checkpoints, the estimator.

``config.py`` (``TrainConfig`` and the rules of its fields), ``trainer.py`` (epochs, shuffled
minibatches, the k schedule, momentum SGD), ``epochs.py`` (the epoch engine every trainer runs
through), ``steps.py`` (the step's functions), ``prepare.py`` (a fresh training made ready: the
rows, ``lr="auto"``, the checks that read the rows, the trainer; the estimator and ``ksae-train``
both call it), ``estimator.py`` (``KSparseAutoencoder`` with fit / transform), ``learning_rate.py``
(``lr="auto"``: the rate from the data's scale), ``checkpoint.py`` (atomic HDF5 checkpoints) and
``checksums.py`` (the SHA-256 of everything inside them), ``options.py`` (the option checks that
training, the baselines and fine-tuning share), ``wording.py`` (the epoch line and durations,
worded alike by the estimator and the commands), ``packed.py`` (``Pack``: trainers stepped together,
on a GPU as one stacked model). The commands' session (run folders, options, resume, progress, and
many runs in one launch, each in its own run folder) is :mod:`ksae_cupy.session`, above.

May import: the top-level algorithm, :mod:`ksae_cupy.gpu`, :mod:`ksae_cupy.datasets`.
"""
