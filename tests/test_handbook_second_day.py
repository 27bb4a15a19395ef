"""The handbook as a user reads it: the API page's docstring roles become code links (mkdocs_hooks.py), the
README's lists name every command and export, and the findings of a second day's read are fixed."""
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def hooks():
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sphinx_roles_become_code_links_or_code():
    html = ('<h2 id="ksae_cupy.training.trainer.Trainer">Trainer</h2><p>see :class:<code>~ksae_cupy.training.trainer.'
            'Trainer</code>, :func:<code>ksae_cupy.metrics.firing_counts</code> and :meth:<code>Trainer</code></p>')
    out = hooks().on_page_content(html, None, None, None)
    assert ":class:" not in out and ":func:" not in out and ":meth:" not in out
    assert '<a href="#ksae_cupy.training.trainer.Trainer"><code>Trainer</code></a>' in out  # ~: the last part
    assert "<code>ksae_cupy.metrics.firing_counts</code>" in out  # not on the page: the name alone
    assert out.count('<a href="#ksae_cupy.training.trainer.Trainer">') == 2  # a short target found by its end


@pytest.mark.skipif(shutil.which("mkdocs") is None and importlib.util.find_spec("mkdocs") is None,
                    reason="the docs extra is not installed (pip install '.[docs]'); CI builds the site")
def test_the_built_api_page_shows_no_raw_role(tmp_path):
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    page = (site / "reference" / "api" / "index.html").read_text()
    prose = re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)  # a code block shows its text as written
    assert re.findall(r":(?:class|func|meth|mod|data|attr|exc):", prose) == []


def test_the_readme_lists_every_command_and_export():
    readme = (ROOT / "README.md").read_text()
    from ksae_cupy.cli.bench import bench_command

    table = readme[readme.index("## Commands"):readme.index("## Defaults")]
    bench_row = next(line for line in table.splitlines() if line.startswith("| `ksae-bench"))
    for name in bench_command.commands:
        assert name in bench_row, f"ksae-bench {name} is missing from the README's command table"
    import ksae_cupy

    exports = readme[readme.index("`ksae_cupy` exports"):].split("\n", 1)[0]
    for name in ksae_cupy.__all__:
        if name != "__version__":
            assert f"`{name}`" in exports, f"{name} is missing from the README's exports"
    from ksae_cupy.cli.plot import plot_command

    plot_row = next(line for line in table.splitlines() if line.startswith("| `ksae-plot"))
    assert all(name in plot_row for name in plot_command.commands)


def test_run_folders_name_only_files_a_run_writes():
    from ksae_cupy.session.runs import RESULT_FILES, RUN_FILES

    readme = (ROOT / "README.md").read_text()
    named = re.search(r"Run folders \(([^;]*);", readme)[1].split(", ")
    written = {Path(name).stem.split("-")[0] for name in RUN_FILES + RESULT_FILES}
    assert all(word in written for word in named), (named, written)


def test_the_testing_page_quotes_no_timing():
    text = (ROOT / "docs" / "guide" / "testing.md").read_text()
    assert not re.search(r"\btook \d+|\d+-\d+ s\b", text)
