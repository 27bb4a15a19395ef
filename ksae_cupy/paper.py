"""The paper's MNIST tables as data, typed once (Makhzani & Frey 2014, section 5).

Every figure the package and the scripts compare against comes from here: ``ksae-eval``'s
``paper_test_error``, the baselines' evaluation, ``bin/paper-tables``, ``bin/reproduce-mnist``,
``bin/reproduce-finetune`` and ``bin/gpu-campaign``. Errors are fractions (0.0135 is 1.35%).

* :data:`ERR_MNIST`, Table err_mnist: logistic regression on the features of an unsupervised
  learner with 1000 hidden units (no fine-tuning). Keys: ``raw``, the baselines' model names
  (as ``ksae-baseline --model`` spells them) and ``k40`` / ``k25`` / ``k10`` for the k-sparse rows.
* :data:`FN_MNIST`, Table fn_mnist: the pretrained network fine-tuned (sections 4.5 and 4.6).
* The training settings (section 4.3; batch 128 from the authors' code), typed here once:
  :class:`~ksae_cupy.training.config.TrainConfig`'s defaults, the fine-tuning's, the baselines' shared ones,
  the benchmarks' shapes and every help text that quotes one read them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PaperRow:
    """One row of a paper table: ``table`` (its label in the paper), ``key`` (how the code names
    the row), ``label`` (as the paper prints it) and ``error`` (the test error, a fraction)."""

    table: str
    key: str
    label: str
    error: float


ROWS = (
    PaperRow("err_mnist", "raw", "Raw Pixels", 0.0720),
    PaperRow("err_mnist", "rbm", "RBM", 0.0181),
    PaperRow("err_mnist", "dropout-ae", "Dropout Autoencoder (50% hidden)", 0.0180),
    PaperRow("err_mnist", "denoising-ae", "Denoising Autoencoder (20% input dropout)", 0.0195),
    PaperRow("err_mnist", "dropout-denoising-ae", "Dropout + Denoising Autoencoder (20% input and 50% hidden)", 0.0160),
    PaperRow("err_mnist", "k40", "k-Sparse Autoencoder, k = 40", 0.0154),
    PaperRow("err_mnist", "k25", "k-Sparse Autoencoder, k = 25", 0.0135),
    PaperRow("err_mnist", "k10", "k-Sparse Autoencoder, k = 10", 0.0210),
    # The paper does not say which net its row is: read both ways (k-sparse units with alpha*k kept, or a
    # plain ReLU network), one figure.
    PaperRow("fn_mnist", "no-pretraining", "Without Pre-Training (k-sparse units, alpha*k = 75 kept)", 0.0160),
    PaperRow("fn_mnist", "no-pretraining-relu", "Without Pre-Training (a plain ReLU network)", 0.0160),
    PaperRow("fn_mnist", "rbm", "RBM + F.T.", 0.0124),
    PaperRow("fn_mnist", "dropout-ae", "Shallow Dropout AE + F.T. (50% hidden)", 0.0105),
    PaperRow("fn_mnist", "denoising-ae", "Denoising AE + F.T. (20% input dropout)", 0.0120),
    PaperRow("fn_mnist", "deep-dropout-ae", "Deep Dropout AE + F.T. (layer-wise pre-training, 50% hidden)", 0.0085),
    PaperRow("fn_mnist", "ksparse", "k-Sparse AE + F.T. (k=25)", 0.0108),
    PaperRow("fn_mnist", "deep-ksparse", "Deep k-Sparse AE + F.T. (k=25, layer-wise pre-training)", 0.0097),
)
ERR_MNIST = tuple(row for row in ROWS if row.table == "err_mnist")
FN_MNIST = tuple(row for row in ROWS if row.table == "fn_mnist")

# The tables' shared setting: MNIST with 1000 hidden units (per layer); other settings have no paper figure.
DATASET, HIDDEN = "mnist", 1000
KSPARSE_KS = (40, 25, 10)  # the k of Table err_mnist's k-sparse rows

# -- the training settings (section 4.3) ------------------------------------------------------------
K = 25  # the best k of Table err_mnist
K_START = 100  # section 4.3.1: "we start off with a large sparsity level (e.g. k=100)"
EPOCHS = 5000  # the unsupervised training's length (section 4.3.2)
BATCH_SIZE = 128  # the authors' code (the paper does not say)
LR, MOMENTUM, SIGMA = 0.01, 0.9, 0.01  # section 4.3.2: rate, momentum, std of the Gaussian initial weights
# Fine-tuning (sections 4.3.2 and 4.6): alpha*k units kept (alpha 3 on MNIST), 200 epochs per phase, the rate
# decaying linearly from 1 to 0.001, momentum 0.25.
ALPHA = 3.0
KEPT = int(ALPHA * K)  # alpha*k units kept per hidden layer: 3 x 25
FINETUNE_EPOCHS, FINETUNE_LR_START, FINETUNE_LR_END, FINETUNE_MOMENTUM = 200, 1.0, 0.001, 0.25


def ksparse_key(k: int) -> str:
    """The key of Table err_mnist's k-sparse row for ``k`` (``k25``)."""
    return f"k{k}"


def errors(table) -> dict[str, float]:
    """``{key: test error}`` of a table (:data:`ERR_MNIST` or :data:`FN_MNIST`)."""
    return {row.key: row.error for row in table}


def err_mnist_error(key: str, dataset: str, hidden: int) -> float | None:
    """Table err_mnist's figure for ``key`` where the setting is the paper's (MNIST, 1000 hidden
    units); None elsewhere or for a row the table lacks."""
    if dataset != DATASET or hidden != HIDDEN:
        return None
    return errors(ERR_MNIST).get(key)
