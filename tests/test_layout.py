"""The package's layout rules, read from the import graph of the source (every import, lazy ones too).

* Layers, lowest first: the algorithm (the top-level modules, ``cpu/`` and ``gpu/``, its
  compiled halves),
  ``datasets``, ``training``, ``session`` (a command's run: folders, options, resume, progress), ``evaluation``, ``supervised``, ``parallel``, ``bench``, ``reports``
  (run folders read, tables written), ``recipes`` (the mains of the scripts under ``bin/``), ``cli``.
  A module imports only from its own layer or a lower one.
* The package's ``__init__`` is the Python API's front door: it may name any layer below
  ``cli/`` (``from ksae_cupy import KSparseAutoencoder``), but only lazily, inside functions,
  so that importing the package loads none of them.
* Nothing outside ``cli/`` imports ``cli/``.
* No import cycle between modules.
* Every folder says in its ``__init__`` docstring what it holds.
* A module over 400 lines says why in its docstring (a line that begins "Over 400 lines:").
* A command module (``cli/``) is at most 120 lines.
"""
from __future__ import annotations

import ast
from pathlib import Path

import ksae_cupy

PACKAGE_DIR = Path(ksae_cupy.__file__).parent
REPO = Path(__file__).resolve().parents[1]  # the checkout these tests sit in (the package may be installed)
LAYERS = ["", "cpu", "gpu", "datasets", "training", "session", "evaluation", "supervised", "parallel", "bench", "reports", "recipes", "cli"]
ALGORITHM = {"", "cpu", "gpu"}  # "" is the package's top level


def _module_name(path: Path) -> str:
    parts = ["ksae_cupy", *path.relative_to(PACKAGE_DIR).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE_DIR.rglob("*.py") if "kernels" not in p.parts}


def _imports(name: str, path: Path) -> set[str]:
    """The ksae_cupy modules (or packages) that ``name`` imports anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:  # `from pkg import module` imports the module
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in MODULES else target)
    return {m for m in found if m == "ksae_cupy" or m.startswith("ksae_cupy.")} - {name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _folder(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (PACKAGE_DIR / parts[1]).is_dir()):
        return parts[1]
    return ""  # a top-level module (or the package itself)


def test_the_graph_is_read():
    assert "ksae_cupy.model" in GRAPH["ksae_cupy.training.trainer"]
    assert "ksae_cupy.gpu.cuda_kernels" in GRAPH["ksae_cupy.topk"]  # a lazy import inside a function
    assert set(LAYERS) >= {_folder(m) for m in MODULES}, "a folder that has no layer: add it to LAYERS"


FRONT_DOOR = "ksae_cupy"  # the package's __init__: the Python API, re-exported lazily


def test_imports_point_down():
    upward = [f"{m} ({_folder(m) or 'top'}) imports {d} ({_folder(d) or 'top'})"
              for m, deps in GRAPH.items() for d in deps
              if m != FRONT_DOOR and LAYERS.index(_folder(d)) > LAYERS.index(_folder(m))
              and not (_folder(m) in ALGORITHM and _folder(d) in ALGORITHM)]
    assert upward == []


def test_the_front_door_imports_only_lazily():
    tree = ast.parse(MODULES[FRONT_DOOR].read_text())
    top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(node) for node in top_level] == []  # every import sits inside a function
    assert not any(_folder(d) == "cli" for d in GRAPH[FRONT_DOOR])
    mentioned = {module for module, _ in __import__(FRONT_DOOR)._API.values()}
    assert mentioned <= set(MODULES), mentioned - set(MODULES)


def test_nothing_imports_the_command_line():
    assert [f"{m} imports {d}" for m, deps in GRAPH.items() for d in deps
            if _folder(d) == "cli" and _folder(m) != "cli"] == []


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(module, path):
        state[module] = 1
        for dep in sorted(GRAPH.get(module, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep in GRAPH and state.get(dep) is None:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_every_folder_says_what_it_holds():
    for init in PACKAGE_DIR.glob("*/__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring) > 40, f"{init.parent.name}/__init__.py needs a docstring"


def test_a_long_module_says_why():
    # One job per module: past 400 lines a module either splits or its docstring says why it holds together.
    long = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()
            if len(path.read_text().splitlines()) > 400}
    silent = [f"{name} ({lines} lines)" for name, lines in sorted(long.items())
              if not any(line.startswith("Over 400 lines:")
                         for line in (ast.get_docstring(ast.parse(MODULES[name].read_text())) or "").splitlines())]
    assert not silent, f"over 400 lines with no 'Over 400 lines:' line in the docstring: {', '.join(silent)}"


def test_a_command_module_stays_thin():
    # cli/ holds click declarations; what a command computes lives in the room that owns the job.
    thick = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()
             if _folder(name) == "cli" and len(path.read_text().splitlines()) > 120}
    assert thick == {}, f"cli/ modules over 120 lines (move what they compute to its room): {thick}"


def test_every_folder_is_installed():
    # A folder missing from setup.cfg's packages is left out of `pip install .` (CI caught one).
    import configparser

    repo = Path(__file__).resolve().parents[1]  # the checkout these tests sit in
    parser = configparser.ConfigParser()
    parser.read(repo / "setup.cfg")
    listed = set(parser["options"]["packages"].split())
    source = repo / "ksae_cupy"
    folders = {"ksae_cupy." + p.parent.relative_to(source).as_posix().replace("/", ".")
               for p in source.rglob("__init__.py") if p.parent != source}
    assert "ksae_cupy.gpu" in folders and folders <= listed, f"add to setup.cfg's packages: {sorted(folders - listed)}"


def test_no_cuda_source_shares_a_stem_with_a_module():
    # A .cu beside a .py of one stem reads as one room in a drawing of the house, and hides the module's imports.
    # kernels/ beside the package in a checkout, ksae_cupy/kernels once installed (setup.cfg's package_dir)
    cuda = {p.stem for folder in (PACKAGE_DIR.parent / "kernels", PACKAGE_DIR / "kernels") for p in folder.glob("*.cu")}
    modules = {p.stem for p in PACKAGE_DIR.rglob("*.py") if "kernels" not in p.relative_to(PACKAGE_DIR).parts}
    assert cuda and not cuda & modules, sorted(cuda & modules)


# -- the house as docs/design.md draws it: rooms, arrows between them, floors -------------------------------


def _room(module: str) -> str:
    """The room ``module`` stands in: its folder (``training/``), else its own file (``model.py``); the package's
    ``__init__`` is a room of its own."""
    if module == FRONT_DOOR:
        return "__init__"
    top = module.split(".")[1]
    return top + "/" if (PACKAGE_DIR / top).is_dir() else top + ".py"


def house_plan() -> tuple[dict[str, int], set[tuple[str, str]]]:
    """``(floor_of_room, arrows)``: an arrow ``(a, b)`` where a module of room ``a`` imports one of room ``b``;
    a room stands one floor above the highest room it imports (floor 1 imports no other room)."""
    # The checkout's modules: an install adds one it writes at build time (_build_commit.py), not part of the house.
    source = {m for m, path in MODULES.items() if (REPO / "ksae_cupy" / path.relative_to(PACKAGE_DIR)).is_file()}
    arrows = {(_room(m), _room(d)) for m in source for d in GRAPH[m] if d in source} - \
        {(room, room) for room in map(_room, source)}
    floors: dict[str, int] = {}

    def floor(room: str, path: tuple = ()) -> int:
        assert room not in path, f"rooms import each other in a circle: {' -> '.join(path + (room,))}"
        if room not in floors:
            below = [floor(b, path + (room,)) for a, b in arrows if a == room]
            floors[room] = 1 + max(below, default=0)
        return floors[room]

    for room in sorted(map(_room, source)):
        floor(room)
    return floors, arrows


def _drawn_house() -> tuple[tuple[int, int, int], dict[str, int]]:
    """docs/design.md's picture of the house: its counts (rooms, floors, arrows) and each room's floor."""
    import re

    text = " ".join((REPO / "docs" / "design.md").read_text().split())
    counts = re.search(r"the package is (\d+) rooms on (\d+) floors with (\d+) arrows", text)
    assert counts, "docs/design.md no longer says 'the package is N rooms on F floors with A arrows'"
    listing = text[text.index("From the top floor down:"):text.index("on the ground.")]
    drawn = {}
    for part in listing.split(";"):
        number = re.search(r"\((\d+)\)\s*$", part)
        for name in re.findall(r"`([^`]+)`", part):
            drawn[name] = int(number.group(1)) if number else 1
    return tuple(map(int, counts.groups())), drawn


def test_the_design_page_draws_the_house_as_it_is():
    floors, arrows = house_plan()
    counts, drawn = _drawn_house()
    assert counts == (len(floors), max(floors.values()), len(arrows)), \
        f"docs/design.md: {len(floors)} rooms on {max(floors.values())} floors with {len(arrows)} arrows (python tests/test_layout.py)"
    assert drawn == floors, "docs/design.md's floors differ: run python tests/test_layout.py"


if __name__ == "__main__":  # the house as docs/design.md draws it, measured now
    floors, arrows = house_plan()
    print(f"{len(floors)} rooms on {max(floors.values())} floors with {len(arrows)} arrows")
    for level in sorted(set(floors.values()), reverse=True):
        print(level, ", ".join(sorted(room for room, at in floors.items() if at == level)))
