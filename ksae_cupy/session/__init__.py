"""A training command's session: everything about one run but the training itself.

``lifecycle.py`` (one run's session, the same for every command: open or resume, lock, settings,
config.json, fit under the checkpoint policy, the last line), ``fields.py`` (every option of the
training commands declared once: flag, help, default, resume policy), ``resuming.py`` (options given
on --resume applied or refused), ``runs.py`` (run folders: config, metrics, checkpoint, identity),
``runlock.py`` (one writer per run folder), ``trained_on.py`` (the data files and codes a run was
trained on, checked), ``checkpoint_policy.py`` (when to save: epochs, minutes), ``stopping.py``
(stop signals), ``progress.py`` (bar and ETA), ``train_run.py`` (ksae-train's model, new or
resumed, and each packed run's), ``packed_runs.py`` (many ksae-train runs in one launch), ``export.py`` (a run's model as safetensors, .npz or a PyTorch state dict), ``outputs.py``
(the one check before a command writes a file: never a file of the run, nor one it reads).

It sits above :mod:`ksae_cupy.training` (the loop: configuration, trainer, epochs, checkpoints, the
estimator) and calls down into it; nothing in ``training/`` imports it.

May import: the top-level modules, :mod:`ksae_cupy.gpu`, :mod:`ksae_cupy.datasets`,
:mod:`ksae_cupy.training`.
"""
