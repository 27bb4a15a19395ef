"""The options of one fine-tuning run (:class:`FinetuneConfig`, saved with the run) and their choice sets.

Its defaults are the paper's supervised MNIST settings, read from :mod:`ksae_cupy.paper`; a field of a kind
:class:`~ksae_cupy.training.config.TrainConfig` has (epochs, rates, momentum, sigma, top-k, dtype, step) is checked
by its rule (:data:`~ksae_cupy.training.config.RULES`), with the same words. :mod:`ksae_cupy.supervised.finetune`,
the network and its trainer, re-exports every name here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ksae_cupy import paper
from ksae_cupy.backend import Backend
from ksae_cupy.errors import KsaeError, OptionError, literal
from ksae_cupy.supervised.units import check_dropout_rate
from ksae_cupy.training.config import RATE, RULES, check_by_rule, check_in_dtype_by_field, check_with
from ksae_cupy.training.options import DictConfig, check_batch_size, check_choice

PHASES = ("softmax", "top", "all")
ACTIVATIONS = ("ksparse", "sigmoid", "relu")
UNITS = ("ksparse", "relu")  # ksae-finetune --no-pretraining --units: a k-sparse net, or a plain ReLU one
TRAIN_ON = ("train", "train+valid")  # the rows fine-tuned on: FinetuneConfig.train_on, ksae-finetune --train-on


@dataclass
class FinetuneConfig(DictConfig):
    """Options of one fine-tuning run; defaults are the paper's supervised MNIST settings.

    Sources: momentum 0.25 and lr 1 -> 0.001 linearly over 200 epochs (section 4.3.2);
    alpha*k units kept in every hidden layer, k=25, alpha=3 on MNIST (section 4.6);
    phases softmax / top / all for the deep net (section 4.6). ``epochs`` is per phase.
    Batch 128 and softmax std 0.01 are our choices (the paper does not say).

    ``activations`` names each hidden layer's units, "ksparse" or "sigmoid"; None (and
    every config written before sigmoid layers existed) means all "ksparse". A sigmoid
    layer's ``kept`` entry is None. Dropout rates are 0 (off) by default.

    ``step``: "dense" (:func:`loss_and_grads`), "sparse" (:mod:`ksae_cupy.supervised.sparse_finetune`:
    only layer 1's ``X W1`` dense, the same math to float rounding), or "auto": sparse when every
    hidden layer is ksparse, no dropout is used and the arrays are NumPy's, else dense. Configs
    written before the field existed load as "auto", so a run resumed from one takes the sparse step
    from then on (``--step dense`` keeps the dense one and its bits).
    """

    kept: list = field(default_factory=lambda: [paper.KEPT])  # alpha*k per ksparse layer, None per sigmoid layer
    activations: list | None = None
    input_dropout: float = 0.0
    hidden_dropout: float = 0.0
    phases: list = field(default_factory=lambda: ["all"])
    epochs: int = paper.FINETUNE_EPOCHS
    batch_size: int = paper.BATCH_SIZE
    lr_start: float = paper.FINETUNE_LR_START
    lr_end: float = paper.FINETUNE_LR_END
    softmax_lr_start: float | None = None  # beyond the paper: the softmax-only phase's own first rate
    momentum: float = paper.FINETUNE_MOMENTUM
    # Beyond the paper's stated numbers: "training started with m = 0.25" read as a momentum that rises, linearly
    # to ``momentum_end`` over each phase's first ``momentum_epochs`` epochs (None: all of them), then stays.
    # None (the default, and every config written before the field existed): 0.25 throughout.
    momentum_end: float | None = None
    momentum_epochs: int | None = None
    sigma: float = paper.SIGMA
    topk: str = "sort"
    seed: int = 0
    dtype: str = "float32"
    step: str = "auto"
    # Beyond the paper's stated split: "train+valid" fine-tunes on the validation rows too (the schedule is
    # fixed, so validation chooses nothing here; the paper does not say which rows it fine-tuned on).
    train_on: str = "train"

    @property
    def fits_valid_rows(self) -> bool:
        """True when the validation rows are fine-tuned on (``train+valid``): no validation error then."""
        return self.train_on == "train+valid"

    def __post_init__(self):
        self.kept = list(self.kept)
        self.activations = ["ksparse"] * len(self.kept) if self.activations is None else list(self.activations)

    def validate(self, n_train: int | None = None, hidden: list[int] | None = None) -> None:
        """Raise :class:`KsaeError` naming the first bad option and what is allowed."""
        check_dropout_rate("input_dropout", self.input_dropout)
        check_dropout_rate("hidden_dropout", self.hidden_dropout)
        if not self.phases or any(p not in PHASES for p in self.phases):
            raise KsaeError(f"phases {self.phases} are not allowed; use a list drawn from {', '.join(PHASES)}")
        # the fields of a kind TrainConfig has, by its rules (training/config.py: RULES)
        check_by_rule("epochs", self.epochs)
        check_with("batch_size", check_batch_size, self.batch_size, n_train)
        check_by_rule("lr_start", self.lr_start, RATE)
        check_by_rule("lr_end", self.lr_end, RATE)
        if self.softmax_lr_start is not None:
            check_by_rule("softmax_lr_start", self.softmax_lr_start, RATE)
            if "softmax" not in self.phases:
                raise OptionError("softmax_lr_start", f"{{name}} {self.softmax_lr_start} applies to the softmax phase, "
                                                      f"and the phases are {','.join(self.phases)}; drop it or "
                                                      f"add softmax to {{phases}}")
        check_by_rule("momentum", self.momentum)
        if self.momentum_end is not None:
            check_by_rule("momentum_end", self.momentum_end, RULES["momentum"])
        if self.momentum_epochs is not None:
            check_by_rule("momentum_epochs", self.momentum_epochs, RULES["epochs"])
            if self.momentum_end is None:
                raise OptionError("momentum_epochs", f"{{name}} {self.momentum_epochs} is the length of a momentum "
                                                     f"ramp, and there is none; give {{momentum_end}} too, or drop "
                                                     f"{{name}}")
        check_by_rule("sigma", self.sigma)
        check_by_rule("topk", self.topk)
        check_by_rule("dtype", self.dtype)
        check_in_dtype_by_field(self.dtype, lr_start=("rate", self.lr_start), lr_end=("rate", self.lr_end),
                                **({} if self.softmax_lr_start is None else
                                   {"softmax_lr_start": ("rate", self.softmax_lr_start)}),
                                sigma=("sigma", self.sigma), momentum=("momentum", self.momentum),
                                **({} if self.momentum_end is None else {"momentum_end": ("momentum", self.momentum_end)}))
        if len(self.activations) != len(self.kept):
            raise KsaeError(f"activations {self.activations} name {len(self.activations)} layers but kept "
                            f"{self.kept} has {len(self.kept)}; give one activation per hidden layer")
        for l, (k, activation) in enumerate(zip(self.kept, self.activations), start=1):
            H = hidden[l - 1] if hidden else None
            if activation not in ACTIVATIONS:
                raise KsaeError(f"activation {activation!r} of layer {l} is not allowed; use one of "
                                f"{', '.join(ACTIVATIONS)}")
            if activation != "ksparse" and k is not None:
                raise KsaeError(f"alpha*k = {k} units kept in {activation} layer {l} is not allowed; a {activation} "
                                f"layer keeps every unit, use None")
            if activation == "ksparse" and (not isinstance(k, (int, np.integer)) or k < 1
                                            or (H is not None and k > H)):
                raise KsaeError(f"alpha*k = {k} units kept in layer {l} is not allowed; use an integer "
                                f"1 <= alpha*k <= {H}")
        check_by_rule("step", self.step)
        check_with("train_on", check_choice, self.train_on, TRAIN_ON)
        if self.step == "sparse" and not self.sparse_step_applies():
            raise OptionError("step", f"{{name}} sparse needs every hidden layer ksparse and no dropout (here: "
                                      f"activations {literal(self.activations)}, input dropout {self.input_dropout}, "
                                      f"hidden dropout {self.hidden_dropout}); use {{name}} dense or auto")

    def sparse_step_applies(self) -> bool:
        """Whether the net is one the sparse step computes: every hidden layer ksparse, no dropout."""
        return (all(a == "ksparse" for a in self.activations) and self.input_dropout == 0
                and self.hidden_dropout == 0)

    def resolved_step(self, backend: Backend) -> str:
        """``dense`` or ``sparse``: ``auto`` resolved for this net on ``backend``."""
        if self.step == "sparse" and backend.is_gpu:
            raise OptionError("step", "{name} sparse runs on the CPU only (NumPy); use {name} dense or auto on a GPU")
        if self.step == "auto":
            return "sparse" if self.sparse_step_applies() and not backend.is_gpu else "dense"
        return self.step


def parse_hidden(text: str) -> list[int]:
    """``--hidden``'s sizes of the fine-tuned network's layers: one or two positive sizes, ``1000`` or ``1000,1000``."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or len(sizes) > 2 or any(h <= 0 for h in sizes):
        raise KsaeError(f"--hidden {text!r} is not allowed; use one or two positive sizes, e.g. 1000 or 1000,1000")
    return sizes


def parse_phases(text: str | None, L: int) -> list[str]:
    """``--phases``, a comma-separated list from :data:`PHASES` (default: ``all`` for one layer, else each in turn)."""
    if text is None:
        return ["all"] if L == 1 else ["softmax", "top", "all"]
    phases = [p.strip() for p in text.split(",") if p.strip()]
    if not phases or any(p not in PHASES for p in phases):
        raise KsaeError(f"--phases {text!r} is not allowed; use a comma-separated list from "
                        f"{', '.join(PHASES)}")
    return phases
