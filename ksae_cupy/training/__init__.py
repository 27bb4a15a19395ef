"""Training a k-sparse autoencoder: the epoch loop, the estimator, run folders and checkpoints.

``trainer.py`` (epochs, shuffled minibatches, the k schedule, momentum SGD), ``estimator.py``
(``KSparseAutoencoder`` with fit / transform), ``learning_rate.py`` (``lr="auto"``: the rate
from the data's scale), ``runs.py`` (run folders: config, metrics,
checkpoint), ``checkpoint.py`` (atomic HDF5 checkpoints), ``export.py`` (a model as safetensors, .npz or
a PyTorch state dict), ``options.py`` (the option checks that
training, the baselines and fine-tuning share). The training commands' session: ``fields.py`` (every
option declared once: flag, help, default, resume policy), ``lifecycle.py`` (one run's session: open or
resume, lock, config.json, fit under the checkpoint policy, the last line), ``resuming.py`` (options
given on --resume applied or refused), ``stopping.py`` (stop signals), ``progress.py`` (bar and ETA),
``train_run.py`` (ksae-train's model, new or resumed). Many runs in one launch: ``packed.py`` (``Pack``:
trainers stepped together, on a GPU as one stacked model) and ``packed_runs.py`` (``train_packed``: each
run in its own run folder, new or resumed).

May import: the top-level algorithm, :mod:`ksae_cupy.gpu`, :mod:`ksae_cupy.datasets`.
"""
