"""The code a Docker server's container runs first is its modules' functions, sent as text."""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import sys
from types import CodeType

import pytest

from astralvessel.sandbox.docker import _boot_connect, _boot_view
from astralvessel.sandbox.docker._bootstrap import (
    CONNECT_BOOTSTRAP,
    USERNS_BOOTSTRAP,
    function_text,
)

TEXTS = {"connect": CONNECT_BOOTSTRAP, "view": USERNS_BOOTSTRAP}


def test_the_text_is_the_whole_function_as_it_stands():
    """What the engine receives is each function's source, cut whole (as inspect finds it),
    with only the descriptor numbers written in for their names."""
    connect = "\n" + inspect.getsource(_boot_connect._astralvessel_connect)
    assert connect == CONNECT_BOOTSTRAP
    view = inspect.getsource(_boot_view._astralvessel_view)
    assert "MEMORY_EVENTS_FD" in view
    assert "MEMORY_LIMIT_FD" in view
    sent = "\n" + view.replace("MEMORY_EVENTS_FD", str(_boot_view.MEMORY_EVENTS_FD)).replace(
        "MEMORY_LIMIT_FD", str(_boot_view.MEMORY_LIMIT_FD)
    )
    assert sent == USERNS_BOOTSTRAP


def test_a_missing_function_is_an_error():
    with pytest.raises(ValueError, match="no top-level function"):
        function_text("_boot_view", "_astralvessel_nothing")


def _global_names(code: CodeType) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _global_names(const)
    return names


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_the_text_stands_alone(name: str):
    """Sent without its module, the function reads no global but builtins (a module constant
    left in would be a NameError in every container), and defines that one function."""
    namespace: dict[str, object] = {"__builtins__": builtins}
    exec(compile(TEXTS[name], "<bootstrap>", "exec"), namespace)  # noqa: S102 - our own text
    defined = {k: v for k, v in namespace.items() if k != "__builtins__"}
    assert len(defined) == 1
    (function,) = defined.values()
    assert callable(function)
    code = function.__code__  # type: ignore[attr-defined]
    assert _global_names(code) <= set(dir(builtins))


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_the_text_runs_on_python_3_8_with_the_standard_library(name: str):
    """An image's own Python runs it: 3.8 syntax, annotations only in comments, stdlib only."""
    tree = ast.parse(TEXTS[name], feature_version=(3, 8))
    (function,) = tree.body
    assert isinstance(function, ast.FunctionDef)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]
            assert node.returns is None
            assert all(arg.annotation is None for arg in arguments)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert not any(isinstance(node, ast.ImportFrom) for node in ast.walk(tree))
    assert imported <= set(sys.stdlib_module_names)
