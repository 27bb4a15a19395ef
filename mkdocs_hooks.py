"""MkDocs hook (mkdocs.yml's ``hooks``): the handbook's pages link to the measurements in ../results/.

Issue 36 moved run folders, JSON, logs and figures out of docs/ into one results/ folder; the pages
link there with relative paths (``../results/figures/x.png``), which GitHub follows as they are. For
the site, this adds those files to the build under ``results-files/``, so the figures show, the links
resolve, and strict mode still reports a link to a file that does not exist. Checkpoints (*.h5, kept
in git history, not in the tree: a restored one) stay off the site; Markdown files there are copied as
text, not rendered as pages.

After the build, every relative link of the built HTML must resolve to a file of the site
(``.ci/site_links.py``): a link MkDocs leaves as it is (a folder) would otherwise reach the site dead.
Each dead link is a warning, so ``mkdocs build --strict`` fails on it, with ``--quiet`` too (on_config).

The docstrings' Sphinx roles (``:class:`X```), which mkdocstrings leaves as they are, become code links
(on_page_content).
"""
from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

RESULTS = Path(__file__).resolve().parent / "results"
SITE_FOLDER = "results-files"
SITE_LINKS = Path(__file__).resolve().parent / ".ci" / "site_links.py"  # standard library only: tested alone
log = logging.getLogger("mkdocs.hooks.site_links")  # under "mkdocs": strict mode counts its warnings


class _ResultsFile(File):
    def is_documentation_page(self) -> bool:
        return False  # copied as it is, a run folder's eval.md too


def on_config(config):
    # --quiet sets the "mkdocs" logger to errors only, so the warnings strict mode counts never reach its
    # counter: `mkdocs build --strict --quiet` passed with dead links. Strict keeps warnings on.
    mkdocs_log = logging.getLogger("mkdocs")
    if config.strict and mkdocs_log.level > logging.WARNING:
        mkdocs_log.setLevel(logging.WARNING)
    return config


def on_files(files, config):
    docs_dir = Path(config.docs_dir).resolve()
    for path in sorted(RESULTS.rglob("*")):
        if path.is_file() and path.suffix != ".h5":
            inside = path.relative_to(RESULTS).as_posix()
            # src_uri is the path a page's link resolves to, relative to docs/: ../results/...
            src_uri = Path(*[".."] * len(docs_dir.relative_to(RESULTS.parent).parts), "results", inside).as_posix()
            files.append(_ResultsFile(src_uri, src_dir=str(docs_dir), dest_dir=config.site_dir,
                                      use_directory_urls=config.use_directory_urls,
                                      dest_uri=f"{SITE_FOLDER}/{inside}", inclusion=InclusionLevel.INCLUDED))
    return files


# A Sphinx role of a docstring as Markdown renders it: :class:`~ksae_cupy.x.Y` -> :class:<code>~ksae_cupy.x.Y</code>
SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):<code>(~?)([\w.]+)(?:\(\))?</code>")


def on_page_content(html, page, config, files):
    """The docstrings' Sphinx roles (mkdocstrings shows them raw) as code: a link where the page documents the
    target (its anchor is the dotted path), the name alone otherwise (``~`` keeps the last part, as Sphinx does)."""
    anchors = set(re.findall(r'id="([\w.]+)"', html))

    def link(match):
        short, target = match.group(1), match.group(2)
        shown = target.rsplit(".", 1)[-1] if short else target
        found = target if target in anchors else next((a for a in anchors if a.endswith("." + target)), None)
        return f'<a href="#{found}"><code>{shown}</code></a>' if found else f"<code>{shown}</code>"

    return SPHINX_ROLE.sub(link, html)


def on_post_build(config):
    spec = importlib.util.spec_from_file_location("site_links", SITE_LINKS)
    site_links = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site_links)
    for dead in site_links.dead_links(Path(config.site_dir)):
        log.warning(f"dead relative link in the built site: {dead}")
