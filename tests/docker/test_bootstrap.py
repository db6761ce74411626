"""The code a Docker server's container runs first is its modules' functions, sent as text."""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import re
import sys
from types import CodeType

import pytest

from astralvessel.sandbox._seccomp._abi import syscall_number
from astralvessel.sandbox.docker import _boot_connect, _boot_view
from astralvessel.sandbox.docker._bootstrap import (
    CONNECT_BOOTSTRAP,
    USERNS_BOOTSTRAP,
    VIEW_NUMBERS,
    function_text,
)
from astralvessel.sandbox.server import _sys, _userns

TEXTS = {"connect": CONNECT_BOOTSTRAP, "view": USERNS_BOOTSTRAP}


def test_the_text_is_the_whole_function_as_it_stands():
    """What the engine receives is each function's source, cut whole (as inspect finds it),
    with only the numbers it names written in for their names."""
    connect = "\n" + inspect.getsource(_boot_connect._astralvessel_connect)
    assert connect == CONNECT_BOOTSTRAP
    view = inspect.getsource(_boot_view._astralvessel_view)
    sent = view
    for name in _boot_view.SENT_NUMBERS:
        assert re.search(rf"\b{name}\b", view), f"{name} is not named by the function"
        sent = re.sub(rf"\b{name}\b", str(getattr(_boot_view, name)), sent)
    assert "\n" + sent == USERNS_BOOTSTRAP


def test_the_view_names_the_numbers_defined_once():
    """The kernel's numbers the view uses are the server's and the seccomp table's."""
    assert VIEW_NUMBERS["CLONE_NEWNS"] == _sys.CLONE_NEWNS
    assert VIEW_NUMBERS["CLONE_NEWUSER"] == _userns.CLONE_NEWUSER
    assert VIEW_NUMBERS["MS_BIND"] == _sys.MS_BIND
    assert VIEW_NUMBERS["PIVOT_ROOT_X86_64"] == syscall_number("pivot_root", "x86_64") == 155
    assert VIEW_NUMBERS["PIVOT_ROOT_AARCH64"] == syscall_number("pivot_root", "aarch64") == 41


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
