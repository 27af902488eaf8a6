"""README and docs: every relative link resolves inside the repository (anchors included),
and the README's Python example runs."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    REPO / "README.md",
    REPO / "CHANGELOG.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "benchmarks" / "results" / "README.md",
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {
        _anchor(m.group(1))
        for m in re.finditer(r"^#+\s+(.+)$", page.read_text(encoding="utf-8"), re.M)
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve_inside_the_repository(page):
    assert page.is_file(), page
    bad = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://|mailto:", target):
            bad.append(f"{target}: links must stay inside the repository")
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or REPO not in dest.parents and dest != REPO:
            bad.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading with anchor '{anchor}' in {dest.name}")
    assert not bad, f"{page.relative_to(REPO)}: " + "; ".join(bad)


def test_readme_python_example_runs(tmp_path, monkeypatch):
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Python API\s+```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    cert = namespace["result"].certificate
    assert cert.status == "optimal" and cert.bound <= cert.objective * (1 + 1e-9)
    assert (tmp_path / "alexnet.json").is_file()
    table = namespace["table"]
    assert len(table) == 8 and table.error.isna().all() and (table.step_time_s > 0).all()
