"""Training a k-sparse autoencoder: the epoch loop, the estimator, run folders and checkpoints.

``trainer.py`` (epochs, shuffled minibatches, the k schedule, momentum SGD), ``estimator.py``
(``KSparseAutoencoder`` with fit / transform), ``learning_rate.py`` (``lr="auto"``: the rate
from the data's scale), ``runs.py`` (run folders: config, metrics,
checkpoint), ``checkpoint.py`` (atomic HDF5 checkpoints), ``options.py`` (the option checks that
training, the baselines and fine-tuning share).

May import: the top-level algorithm, :mod:`ksae_cupy.gpu`, :mod:`ksae_cupy.datasets`.
"""
