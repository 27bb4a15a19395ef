"""The paper's training settings have one home, ksae_cupy/paper.py: no module of the package types one of them
again as a default (a function's or a dataclass field's default, an option's ``default=``, a keyword argument,
a dict entry or a constant named after the setting). Benchmark grids that pin a shape on purpose are listed."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from ksae_cupy import paper

PACKAGE = Path(__file__).resolve().parents[1] / "ksae_cupy"

# A setting's names (as arguments, options, fields and constants spell it) -> the paper's value.
SETTINGS = {
    ("hidden", "n_hidden", "paper_hidden"): paper.HIDDEN,
    ("k",): paper.K,
    ("k_start",): paper.K_START,
    ("epochs", "ksparse_epochs", "pretrain_epochs"): paper.EPOCHS,
    ("batch", "batch_size"): paper.BATCH_SIZE,
    ("lr", "paper_lr"): paper.LR,
    ("momentum",): paper.MOMENTUM,
    ("sigma",): paper.SIGMA,
    ("finetune_epochs",): paper.FINETUNE_EPOCHS,
}
# A help text quoting the paper's figure: "(paper: 5000)", "(paper, MNIST: 1000)", typed instead of read.
QUOTED = re.compile(r"\(paper[^:()]*:\s*([0-9][0-9.]*)")
PAPER_VALUES = {value for name, value in vars(paper).items() if name.isupper() and type(value) in (int, float)}
VALUE_OF = {name: value for names, value in SETTINGS.items() for name in names}

# Benchmark grids: shapes a benchmark pins on purpose (its JSON records them), not a run's defaults.
ALLOWED: set[tuple[str, str]] = set()  # (module, setting), e.g. ("bench/kernel_grid.py", "k")


def _name(node) -> str | None:
    """The setting a default belongs to: an argument's, a keyword's, a constant's or an option's flag."""
    if isinstance(node, str):
        return node.lstrip("-").replace("-", "_").lower()
    return None


def _option_flag(call: ast.Call) -> str | None:
    for arg in call.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
            return arg.value
    return None


def paper_numbers(tree: ast.AST):
    """``(line, setting, value)`` of every default in ``tree`` that types a paper setting's value."""
    def hit(name, value_node, line):
        name = _name(name)
        if name in VALUE_OF and isinstance(value_node, ast.Constant) and type(value_node.value) in (int, float) \
                and value_node.value == VALUE_OF[name]:
            yield line, name, value_node.value

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args.posonlyargs + node.args.args
            for arg, default in zip(args[len(args) - len(node.args.defaults):], node.args.defaults):
                yield from hit(arg.arg, default, default.lineno)
            for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
                if default is not None:
                    yield from hit(arg.arg, default, default.lineno)
        elif isinstance(node, ast.Call):
            flag = _option_flag(node)
            for keyword in node.keywords:
                if keyword.arg == "default" and flag:
                    yield from hit(flag, keyword.value, keyword.value.lineno)
                elif keyword.arg:
                    yield from hit(keyword.arg, keyword.value, keyword.value.lineno)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield from hit(node.target.id, node.value, node.lineno)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            yield from hit(node.targets[0].id, node.value, node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for number in QUOTED.findall(node.value):
                if float(number.rstrip(".")) in PAPER_VALUES:
                    yield node.lineno, "help text", number
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield from hit(key.value, value, value.lineno)


def test_the_scan_finds_a_paper_number_typed_as_a_default():
    source = ("def f(hidden=1000, lr=0.5):\n    ap.add_argument('--batch-size', type=int, default=128)\n"
              "PAPER_LR = 0.01\nrun(epochs=5000, k=3)\nx = {'momentum': 0.9}\nhelp = f'Epochs (paper: 5000), {n}'\n"
              "fine = f'Epochs (paper: {paper.EPOCHS})'\n")
    assert sorted(name for _, name, _ in paper_numbers(ast.parse(source))) == \
        ["batch_size", "epochs", "help text", "hidden", "momentum", "paper_lr"]


def test_the_papers_settings_are_typed_in_paper_py_only():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "paper.py":
            continue
        for line, name, value in paper_numbers(ast.parse(path.read_text(), str(path))):
            if (relative, name) not in ALLOWED:
                found.append(f"{relative}:{line}: {name} = {value} (read it from ksae_cupy.paper)")
    assert not found, "\n".join(found)
    assert len(ALLOWED) <= 5
