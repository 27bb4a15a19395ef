"""The built handbook's relative links: every ``href`` and ``src`` in its HTML that names no scheme or host must
resolve to a file of the site (a folder: its index.html). MkDocs checks the links it recognizes (pages, files it
copies); a link it leaves as it is (a run folder, say) reaches the site unchecked, and is dead there.

mkdocs_hooks.py runs this after every build (``mkdocs build --strict`` then fails on a dead link); by hand::

    python .ci/site_links.py SITE_DIR          # prints each dead link, exit status 1 when there is one

Standard library only: tests/test_site_links.py runs it without MkDocs.
"""
from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.targets += [value for name, value in attrs if name in ("href", "src") and value]


def dead_links(site: Path) -> list[str]:
    """``"page.html -> target"`` for every relative link of the site's pages that resolves to no file."""
    site = Path(site).resolve()
    dead = []
    for page in sorted(site.rglob("*.html")):
        parser = _Links()
        parser.feed(page.read_text(errors="replace"))
        for target in parser.targets:
            parts = urlsplit(target)
            if parts.scheme or parts.netloc or not parts.path:  # another site, mailto:, data:, "#anchor" alone
                continue
            path = unquote(parts.path)
            resolved = (site / path.lstrip("/") if path.startswith("/") else page.parent / path).resolve()
            if resolved.is_dir():
                resolved = resolved / "index.html"
            if not resolved.is_file() or not resolved.is_relative_to(site):  # out of the site: not on the web
                dead.append(f"{page.relative_to(site).as_posix()} -> {target}")
    return dead


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        print("error: give the built site's folder, e.g. python .ci/site_links.py site", file=sys.stderr)
        sys.exit(2)
    found = dead_links(Path(sys.argv[1]))
    print("\n".join(found) or "no dead relative link")
    sys.exit(1 if found else 0)
