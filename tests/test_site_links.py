"""The check of the built handbook's links (.ci/site_links.py, run by mkdocs_hooks.py after every build): every
relative href and src of the site's HTML resolves to a file of the site. Here on a small site written by hand,
so that it runs without MkDocs."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("site_links", ROOT / ".ci" / "site_links.py")
site_links = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(site_links)


def test_a_dead_relative_link_is_named_and_the_rest_pass(tmp_path):
    site = tmp_path / "site"
    for name in ("index.html", "guide/index.html", "results-files/runs/a/eval.md", "img/x.png"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("")
    (tmp_path / "outside.md").write_text("")  # beside the site, not on it
    (site / "guide" / "index.html").write_text(
        '<a href="../">home</a> <a href="../index.html#top">home</a> <a href="#here">here</a> '
        '<img src="../img/x.png"> <a href="../results-files/runs/a/eval.md">eval</a> <a href="/guide/">abs</a> '
        '<a href="https://example.org/x">web</a> <a href="mailto:a@b">mail</a> '
        '<a href="../results/runs/a/">folder left as it was</a> <img src="../img/missing%20one.png"> '
        '<a href="../../outside.md">out of the site</a>')
    assert site_links.dead_links(site) == [
        "guide/index.html -> ../results/runs/a/",
        "guide/index.html -> ../img/missing%20one.png",
        "guide/index.html -> ../../outside.md"]
    (site / "results" / "runs" / "a").mkdir(parents=True)
    (site / "results" / "runs" / "a" / "index.html").write_text("")  # a folder with its index.html
    assert len(site_links.dead_links(site)) == 2
