"""The optimizers, declared once: :data:`OPTIMIZERS`, one :class:`OptimizerEntry` per name.

An entry holds everything the package asks of an optimizer: how ``ksae-train --optimizer`` (and
:class:`~ksae_cupy.training.config.TrainConfig`'s ``optimizer``) spells it and its help words, how a
trainer builds it, its update on plain arrays (NumPy or CuPy) and, where it has them, the same update on
the CPU kernels and on the GPU's captured step. The paper's is momentum SGD (section 4.3.2).

The protocol an optimizer keeps: ``make(params, config, xp)`` returns an object with ``velocities``, one
state array per parameter, named and shaped as the parameter (a checkpoint's ``optim/`` group: a resumed
run takes the very same next step), and ``step(optimizer, params, grads, lr)`` updates the parameters in
place. Adding an optimizer is its update (:mod:`ksae_cupy.momentum_sgd`) and one entry here; :func:`register` adds
one at run time (a test's toy optimizer, a user's plug-in).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ksae_cupy.cpu import momentum as cpu_momentum
from ksae_cupy.momentum_sgd import MomentumSGD
from ksae_cupy.registry import Registry


@dataclass(frozen=True)
class OptimizerEntry:
    """One optimizer. ``name``: how ``--optimizer`` spells it (and ``config.json``); ``help``: its help words;
    ``make(params, config, xp)``: the optimizer of a run (its state zero); ``step(optimizer, params, grads, lr)``:
    one update in place, on any array module; ``cpu_step``: the same update on the CPU kernels, bit for bit
    (None: ``step`` there too); ``cpu_rows_step``: the update taking ``W_dh``'s gradient in parts, row by row
    (the sparse step on the CPU kernels; None: that step hands this optimizer ``W_dh``'s gradient whole);
    ``cpu_parts_step``: the update taking gradients that apply themselves (the sparse fine-tuning step; None:
    they are made arrays first); ``captured``: the GPU's captured step (:mod:`ksae_cupy.gpu.graph_step`)
    computes this update (else the GPU trainer takes the plain step)."""

    name: str
    help: str
    make: Callable
    step: Callable
    cpu_step: Callable | None = None
    cpu_rows_step: Callable | None = None
    cpu_parts_step: Callable | None = None
    captured: bool = False


def _momentum(params, config, xp) -> MomentumSGD:
    return MomentumSGD(params, config.momentum, xp)


PAPER = "momentum"  # the paper's optimizer (section 4.3.2): TrainConfig's default, the fine-tuning's, the baselines'
OPTIMIZERS: Registry = Registry("optimizer")  # name -> OptimizerEntry
register = OPTIMIZERS.register  # add one entry (a name already there is refused in one line)


register(OptimizerEntry(PAPER, "momentum SGD, v <- m v - lr g; theta <- theta + v (the paper's)", _momentum,
                        MomentumSGD.step, cpu_momentum.fused_step, cpu_momentum.rows_step, cpu_momentum.parts_step,
                        captured=True))


lookup = OPTIMIZERS.lookup  # the entry of a name, or a one-line error naming it and the optimizers there are


def described() -> str:
    """``name (help); ...``: every optimizer, as ``--optimizer``'s help lists them."""
    return "; ".join(f"{entry.name} ({entry.help})" for entry in OPTIMIZERS.values())
