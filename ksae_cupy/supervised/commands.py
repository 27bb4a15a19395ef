"""The options of ``ksae-baseline`` and ``ksae-finetune``, declared once (see :mod:`ksae_cupy.session.fields`
for what a declaration holds and what each resume policy means). The options every training command
shares are :data:`~ksae_cupy.session.fields.SHARED`'s; the paper's numbers are read from the configs."""
from __future__ import annotations

from ksae_cupy.supervised.baseline_registry import own_options, per_family_default, registered
from ksae_cupy import paper
from ksae_cupy.datasets.registry import names as dataset_names
from ksae_cupy.supervised.finetune_config import TRAIN_ON, UNITS, FinetuneConfig
from ksae_cupy.session.fields import APPLIED, KEPT, PAPER, SHARED, THREADS_DEFAULT, Option, options_class, shared

FINETUNE_PAPER = FinetuneConfig()  # the paper's supervised settings (section 4.3.2)
LABELLED = dataset_names(labelled=True)  # the datasets ksae-finetune can train on
REGISTRY = registered()  # the baselines, their learners loaded


BASELINE = [
    Option("model", f"The baseline: {', '.join(f'{b.name} ({b.what})' for b in REGISTRY.values())}.", None, REGISTRY),
    Option("hidden", f"Hidden units (paper: {PAPER.hidden} on MNIST).", PAPER.hidden, int),
    Option("epochs", f"Epochs (the paper's unsupervised length: {PAPER.epochs}).", PAPER.epochs, int, APPLIED),
    Option("batch_size", "Minibatch size.", PAPER.batch_size, int),
    Option("lr", f"Learning rate (chosen on MNIST validation: docs/baselines-grid.md). "
           f"{per_family_default('lr')}", None, float),
    Option("momentum", f"Momentum (paper: {PAPER.momentum}).", PAPER.momentum, float),
    Option("weight_decay", "L2 weight decay on W. "
           f"{per_family_default('weight_decay')}", None, float),
    Option("sigma", f"Std of the Gaussian initial weights (paper: {PAPER.sigma}).", PAPER.sigma, float),
    SHARED["seed"].but(help="Seed of the initial weights, the batch order and the noise."),
    SHARED["dtype"],
    *shared("device", "run_dir", "checkpoint_every", "checkpoint_minutes", "overwrite", "resume", "data_dir", "threads",
            "progress_seconds", "quiet",
            run_dir="Folder for checkpoint.h5, config.json, metrics.jsonl. "
                    "[default: runs/<dataset>-<model>-h<H>-<time>]",
            resume="Continue the run in this folder; --epochs, --device, --checkpoint-*, --threads, --data-dir and "
                   "--progress-seconds may be given, options that would change the run are refused by name.",
            threads=f"Threads on the CPU for BLAS. {THREADS_DEFAULT}"),
    *own_options(),  # the settings a baseline has of its own (its registry entry declares them)
]
BaselineOptions = options_class("BaselineOptions", BASELINE)  # ksae-baseline's values, by attribute

FINETUNE = [
    Option("dataset", f"Deprecated: give DATASET as an argument. Labelled dataset: {', '.join(LABELLED)}, "
           "or your file (see ksae-train). [default: the pretrained run's, with its labels and splits]", None,
           resume=KEPT),
    Option("alpha", f"Keep alpha*k units per hidden layer (paper, MNIST: {paper.ALPHA:g}).", paper.ALPHA, float),
    Option("epochs", f"Epochs per fine-tuning phase (paper: {FINETUNE_PAPER.epochs}).", FINETUNE_PAPER.epochs, int),
    Option("phases", "Comma-separated phases from softmax,top,all. [default: all (shallow); softmax,top,all (deep)]",
           None),
    Option("lr_start", f"First learning rate (paper, MNIST: {FINETUNE_PAPER.lr_start:g}; NORB: 0.01).",
           FINETUNE_PAPER.lr_start, float),
    Option("lr_end", f"Last learning rate, reached linearly (paper: {FINETUNE_PAPER.lr_end}).", FINETUNE_PAPER.lr_end,
           float),
    Option("softmax_lr_start", "Beyond the paper: first learning rate of the softmax-only phase of a deep net "
           "(1000 dense sigmoid features want far less than --lr-start 1). [default: --lr-start]", None, float),
    Option("rising_lr", "Allow --lr-end above --lr-start (a schedule that rises).", False, bool),
    Option("train_on", "Rows fine-tuned on: train (MNIST: 50,000; the validation error is reported), or beyond the "
           "paper's stated split train+valid (60,000: the schedule is fixed, so validation chooses nothing; no "
           "validation error then).", FINETUNE_PAPER.train_on, TRAIN_ON),
    Option("momentum", f"Momentum (paper, MNIST: {FINETUNE_PAPER.momentum}; NORB: 0.9); with --momentum-end the "
           f"first of a ramp.",
           FINETUNE_PAPER.momentum, float),
    Option("momentum_end", "Beyond the paper's numbers (it says training \"started with\" 0.25): the momentum rises "
           "linearly from --momentum to this over each phase's first --momentum-epochs, then stays. "
           "[default: none, --momentum throughout]", None, float),
    Option("momentum_epochs", "With --momentum-end: the ramp's length in epochs. [default: --epochs]", None, int),
    Option("input_dropout", "Beyond the paper's stated settings: the fraction of input pixels dropped in each "
           "fine-tuning step (the dropout paper's MNIST nets drop 20%). [default: the pretrained baseline's own "
           "(denoising AE: 0.2), else 0]", None, float),
    Option("hidden_dropout", "Beyond the paper's stated settings: the fraction of every hidden layer's units dropped "
           "in each fine-tuning step. [default: the pretrained baseline's own (dropout AE: 0.5), else 0]", None,
           float),
    Option("batch_size", "Minibatch size of the fine-tuning (and of --baseline's pretraining).",
           FINETUNE_PAPER.batch_size, int),
    Option("sigma", "Std of the Gaussian initial softmax (and random) weights.", FINETUNE_PAPER.sigma, float),
    Option("no_pretraining", "Random initial weights instead of pretrained runs.", False, bool),
    Option("units", "With --no-pretraining: the hidden units, ksparse (alpha*k kept: the k-sparse net without "
           "its pretraining) or relu (a plain network, every unit max(z, 0)).", "ksparse", UNITS),
    Option("baseline", "Pretrain this baseline here and fine-tune its sigmoid layers with its dropout (section 4.5). "
           "Each layer is a ksae-baseline run folder inside the run's (RUN/pretrain-layer1, ...), with "
           "checkpoints: a stopped run goes on with --resume RUN.", None, REGISTRY),
    Option("pretrain_epochs", f"With --baseline: epochs per layer (paper: {PAPER.epochs}).", PAPER.epochs, int),
    Option("hidden", "With --no-pretraining or --baseline: hidden units per layer, e.g. 1000 or 1000,1000.",
           str(PAPER.hidden)),
    Option("k", "With --no-pretraining: k of every layer (alpha*k are kept).", PAPER.k, int, flag="--k"),
    SHARED["seed"].but(help="Seed of the new weights (the softmax; every layer with --no-pretraining), the batch "
                            "order and dropout masks."),
    SHARED["dtype"],
    SHARED["device"],
    SHARED["step"].but(help="Training step: dense, sparse (only layer 1's X W1 dense; k-sparse layers, no dropout, "
                            "CPU), or auto (sparse where it applies, else dense). Allowed with --resume.",
                       type=str),  # checked by finetune_run.check_step, in one line
    *shared("topk", "threads", "run_dir", "checkpoint_every", "checkpoint_minutes", "overwrite", "resume", "data_dir",
            "progress_seconds", "quiet",
            run_dir="Folder for checkpoint.h5, config.json, metrics.jsonl and finetune.json. "
                    "[default: runs/finetune-<dataset>-<time>]",
            resume="Continue the fine-tuning run in this folder; --device, --step, --topk, --threads, "
                   "--checkpoint-*, --data-dir and --progress-seconds may be given, the others are refused by name."),
]
FinetuneOptions = options_class("FinetuneOptions", FINETUNE)  # ksae-finetune's values, by attribute
