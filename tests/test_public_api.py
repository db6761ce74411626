"""The public surface: __all__ lists exactly the public names, sorted, and each imports."""

from __future__ import annotations

import importlib

import pytest

import astralvessel

PUBLIC_MODULES = [
    "astralvessel",
    "astralvessel.adapters",
    "astralvessel.adapters.anthropic",
    "astralvessel.adapters.openai",
    "astralvessel.mcp_server",
    "astralvessel.sandbox",
    "astralvessel.testing",
    "astralvessel.web",
]


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_is_complete(module_name: str) -> None:
    """__all__ has no repeats, and every public attribute defined there is listed.

    (Its order is ruff's RUF022 isort-style order, checked by the lint session.)
    """
    module = importlib.import_module(module_name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported))
    for name in exported:
        assert getattr(module, name) is not None
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, type(importlib))
        and name not in {"annotations", "TYPE_CHECKING", "Any"}
    }
    assert public <= set(exported) | {"version", "PackageNotFoundError", "importlib"}


def test_version_comes_from_metadata() -> None:
    """__version__ is the installed distribution's version."""
    from importlib.metadata import version

    assert astralvessel.__version__ == version("astralvessel")


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_exported_error_is_in_errors(module_name: str) -> None:
    """Each exception class a public module exports is the one astralvessel.errors defines."""
    from astralvessel import errors

    module = importlib.import_module(module_name)
    for name in module.__all__:
        value = getattr(module, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert name in errors.__all__, f"{module_name}.{name} is not in astralvessel.errors"
            assert getattr(errors, name) is value
            assert value.__module__ == "astralvessel.errors"


def test_import_and_cli_start_leave_the_heavy_stacks_unimported() -> None:
    """`import astralvessel` and the CLI's start (its parser, with every command registered)
    import no sandbox session, web, TLS, asyncio or JSON Schema stack: each command imports
    what it runs (0.5 s of CPU a start, before; ssl alone is 15 ms)."""
    import subprocess
    import sys

    heavy = [
        "asyncio",
        "jsonschema",
        "docker",
        "importlib.metadata",
        "ssl",
        "astralvessel.web",
        "astralvessel.executor",
        "astralvessel.sandbox._session",
    ]
    # What the interpreter's start already holds (a site .pth may import some) is not counted.
    probe = (
        "import sys; before = set(sys.modules); import astralvessel.cli; "
        "astralvessel.cli.build_parser(); "
        f"print(sorted(set({heavy!r}) & (set(sys.modules) - before)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
