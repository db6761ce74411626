"""Fixtures for the built-in tools: a real data tree, a canary outside it, and a file-tool caller."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from astralvessel.sandbox.server._files import FileContext, handle
from tests.conformance.calls import VIEWS

CANARY = "CANARY-host-secret-7f3a"


@attrs.frozen
class Tree:
    """A data root and a workspace the tools may see, and an outside folder holding a canary."""

    data: Path
    workspace: Path
    outside: Path

    @property
    def canary(self) -> Path:
        return self.outside / "canary.txt"

    def context(self, *, timeout: float = 30.0, **overrides: Any) -> FileContext:
        values: dict[str, Any] = {
            "workdir": str(self.data),
            "visible_roots": [str(self.data), str(self.workspace)],
            "deadline": time.monotonic() + timeout,
            "timeout": timeout,
        }
        values.update(overrides)
        return FileContext(**values)


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    """A fresh data tree with an outside canary."""
    made = Tree(data=tmp_path / "data", workspace=tmp_path / "ws", outside=tmp_path / "outside")
    for folder in (made.data, made.workspace, made.outside):
        folder.mkdir()
    made.canary.write_text(CANARY + "\n")
    (made.outside / "sub").mkdir()
    (made.outside / "sub" / "canary.md").write_text(CANARY + "\n")
    return made


Call = Callable[..., "tuple[str, bool]"]


@pytest.fixture
def call(tree: Tree) -> Call:
    """Call a file tool with keyword arguments in the tree's context."""

    def run(tool: str, **arguments: Any) -> tuple[str, bool]:
        return handle(VIEWS[tool], arguments, tree.context())

    return run
