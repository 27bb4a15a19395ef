"""Supervised learning on top of the autoencoder: fine-tuning (shallow and deep), layer-wise
pretraining, and the baselines of Table fn_mnist (RBM, dropout and denoising autoencoders).
``commands.py`` declares the options of ksae-baseline and ksae-finetune; ``baseline_run.py`` and
``finetune_run.py`` make those commands' trainers, new or resumed; ``finetune_progress.py`` is what
ksae-finetune shows while it runs.

May import: the algorithm, gpu, datasets, training, session, evaluation.
"""
