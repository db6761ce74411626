"""Every import in an integration page's samples works with the extras the package declares."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PAGES = sorted((Path(__file__).parents[1] / "docs" / "integrations").glob("*.md"))
if sys.version_info < (3, 11):
    # The deepagents extra installs nothing before 3.11 (its marker; Deep Agents needs 3.11),
    # as tests/integrations/conftest.py leaves its suite out there.
    PAGES = [page for page in PAGES if page.stem != "deepagents"]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def imports_of(page: Path) -> list[str]:
    """The import statements of the page's Python samples, as written."""
    found = []
    for code in BLOCK.findall(page.read_text()):
        try:
            tree = ast.parse(code)
        except SyntaxError:  # a signature sketch, not a program
            continue
        found += [
            ast.unparse(node)
            for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom))
        ]
    return found


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_a_pages_imports_are_installed_by_its_extra(page: Path) -> None:
    """What a page's sample imports is installed by the extra the page names (the test
    environment installs every extra, as a reader following each page would)."""
    for statement in imports_of(page):
        exec(statement, {})  # noqa: S102 - an import line of our own documentation
