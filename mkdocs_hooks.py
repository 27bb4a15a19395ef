"""MkDocs hook (mkdocs.yml's ``hooks``): the handbook's pages link to the measurements in ../results/.

Issue 36 moved run folders, JSON, logs and figures out of docs/ into one results/ folder; the pages
link there with relative paths (``../results/figures/x.png``), which GitHub follows as they are. For
the site, this adds those files to the build under ``results-files/``, so the figures show, the links
resolve, and strict mode still reports a link to a file that does not exist. Checkpoints (*.h5,
6 MB each) stay off the site; Markdown files there are copied as text, not rendered as pages.
"""
from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

RESULTS = Path(__file__).resolve().parent / "results"
SITE_FOLDER = "results-files"


class _ResultsFile(File):
    def is_documentation_page(self) -> bool:
        return False  # copied as it is, a run folder's eval.md too


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
