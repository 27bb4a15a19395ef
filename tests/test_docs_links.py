"""Every relative link in README.md, the handbook (docs/**/*.md) and results/**/*.md points to a file
or folder that exists, and every link to a heading (``page.md#heading``, ``#heading``) to a heading that exists.

A cheap stand-in for ``mkdocs build --strict`` (which CI runs, and which checks the handbook's links
too): this needs no mkdocs, covers the README, which the site does not build, and runs in the
default tier, so a section moved out of the README cannot leave a link behind."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or ')'
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "results").rglob("*.md"))]


def prose(text: str) -> str:
    """The text outside fenced code blocks, indented code blocks and code spans: links there are not links."""
    text = FENCE.sub("", text)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    return CODE_SPAN.sub("", text)


def relative_links(path: Path) -> list[str]:
    return [target for target in LINK.findall(prose(path.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: ... are not checked


def slug(heading: str) -> str:
    """The anchor GitHub and MkDocs give a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = CODE_SPAN.sub(lambda m: m[0].strip("`"), heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", heading))


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m[1]) for m in re.finditer(r"^#+\s+(.*?)\s*#*\s*$", text, re.M)}


def shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target} (no {shown(resolved)})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor} in {shown(resolved)})")
    return broken


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == [], f"{path.relative_to(ROOT)} links to what does not exist"


def test_the_checker_sees_links_and_catches_broken_ones(tmp_path):
    # The check above cannot pass by finding no links: here, one of each kind, good and bad.
    (tmp_path / "page.md").write_text("# Page\n\n## A heading, with `code`\n")
    (tmp_path / "folder").mkdir()
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Top\n[ok](page.md) ![img](page.md \"title\") [dir](folder/) [anchor](page.md#a-heading-with-code)\n"
        "[self](#top) [web](https://example.org/x) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
        "[gone](missing.md) [bad anchor](page.md#nothing) [bad self](#nowhere)\n")
    assert len(relative_links(readme)) == 8
    assert broken_links(readme) == [
        f"missing.md (no {tmp_path / 'missing.md'})",
        "page.md#nothing (no heading #nothing in " + str(tmp_path / "page.md") + ")",
        "#nowhere (no heading #nowhere in " + str(readme) + ")",
    ]


def test_every_handbook_page_is_in_the_navigation():
    # mkdocs build --strict fails on a page outside mkdocs.yml's nav (validation: omitted_files: warn); this says
    # so without MkDocs. A nav entry is "title: path.md" (or "- path.md"), one a line.
    nav = set(re.findall(r"^\s*-\s+(?:[^\n]*?:\s+)?([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {path.relative_to(ROOT / "docs").as_posix() for path in (ROOT / "docs").rglob("*.md")}
    assert pages - nav == set(), "pages outside mkdocs.yml's nav"
    assert nav - pages == set(), "nav entries with no page"
