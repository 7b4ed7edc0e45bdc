"""The manual's shape: the README stays a short door, and every link in it, in docs/ and in the folders' READMEs
leads to a file that exists and, with a #fragment, to a heading in it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("*/README.md"))]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    out = []
    for target in LINK.findall(CODE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked here (no network)
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            out.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif fragment and dest.is_file() and dest.suffix == ".md" and fragment not in anchors(dest):
            out.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return out


def test_the_readme_is_a_short_door():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to a page under docs/"


def test_every_link_resolves():
    assert [p for p in pages() if p.exists()], "no pages found"
    # An unclosed code fence would hide the rest of its page from the check (and from readers).
    assert [p.name for p in pages() if len(re.findall(r"^ *```", p.read_text(), re.M)) % 2] == []
    assert [b for p in pages() for b in broken_links(p)] == []


def test_the_link_check_finds_what_is_broken(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Comparing the engines: `runner bench`\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md) [ok](docs/a.md#comparing-the-engines-runner-bench) [ok](#here)\n"
                    "# Here\n[gone](docs/b.md) [no heading](docs/a.md#nowhere) [web](https://example.com/x)\n"
                    "`[in code](nowhere.md)`\n")
    assert broken_links(page, tmp_path) == ["README.md: docs/b.md (no such file)", "README.md: docs/a.md#nowhere (no such heading)"]
