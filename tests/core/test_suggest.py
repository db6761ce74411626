"""Names the user got wrong: each answer names the closest valid names and lists them all."""

from __future__ import annotations

import pytest

from astralvessel import BackendUnavailableError, Registry, Scope, UsageError
from astralvessel._ground._suggest import closest, missing_extra, unknown_name
from astralvessel.sandbox import Policy
from astralvessel.sandbox._discovery import backend_names, get_backend
from astralvessel.testing import ScriptedModel


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("bubblewarp", "bubblewrap"), ("nsjal", "nsjail"), ("Docker", "docker"), ("dokcer", "docker")],
)
def test_a_typo_finds_the_backend_meant(typed: str, meant: str) -> None:
    """A typo, a case slip or a dropped letter finds the name that was meant first."""
    assert closest(typed, backend_names())[0] == meant


def test_an_unrelated_word_suggests_nothing() -> None:
    """A word like no valid name gets the list alone, not a wild guess."""
    message = unknown_name("backend", "firecracker", ["bubblewrap", "nsjail", "docker"])
    assert message == "unknown backend 'firecracker'; backends are bubblewrap, nsjail, docker"


def test_unknown_backend_suggests_and_lists_without_inventing_a_package() -> None:
    """get_backend of a typo says "did you mean", lists every backend, and names no package."""
    with pytest.raises(BackendUnavailableError) as info:
        get_backend("bubblewarp")
    message = str(info.value)
    assert message.startswith("unknown backend 'bubblewarp'; did you mean 'bubblewrap'?")
    assert all(name in message for name in backend_names())
    assert "pip install" not in message


def test_unknown_dialect_suggests_the_closest() -> None:
    """Registry.schemas and ScriptedModel answer a misspelt dialect with the closest names."""
    with pytest.raises(UsageError, match=r"did you mean 'openai'"):
        Registry().schemas("opnai")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"did you mean 'anthropic'"):
        ScriptedModel("antropic", [])


def test_unknown_scope_and_promise_suggest_the_closest() -> None:
    """A misspelt scope or promise is answered with the one meant."""
    with pytest.raises(UsageError, match=r"did you mean 'tools:read'"):
        Scope.parse("tools:reed")
    with pytest.raises(
        UsageError, match=r"unknown promise 'no-netwrok'; did you mean 'no-network'"
    ):
        Policy().relax("no-netwrok")


def test_a_missing_extra_names_the_package_and_the_words_that_install_it() -> None:
    """Every integration's import error says what needs which package, and installs the extra
    from the source folder (Deep Agents' used to name an unpublished distribution)."""
    error = missing_extra("the Deep Agents integration", "deepagents", "deepagents")
    assert isinstance(error, ImportError)
    assert str(error) == (
        "the Deep Agents integration needs the deepagents package: pip install '.[deepagents]' "
        "in astralvessel's source folder ('astralvessel[deepagents]' where the package is "
        "published)"
    )
