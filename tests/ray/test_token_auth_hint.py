"""Joining a Ray cluster that asks for a token this process does not send: the hint says so."""

from __future__ import annotations

from pathlib import Path

from astralvessel.ray._auth import token_auth_hint


def test_a_token_file_with_the_mode_unset_is_named_with_both_ways_out(tmp_path: Path) -> None:
    """The case a `ray start` after a local ray.init() makes: the hint names the file and both
    settings of RAY_AUTH_MODE; a set mode, or no token file, gives no hint."""
    assert token_auth_hint({}, tmp_path) is None
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("0123456789abcdef")
    hint = token_auth_hint({}, tmp_path)
    assert hint is not None
    assert str(token) in hint
    assert "RAY_AUTH_MODE=token" in hint
    assert "RAY_AUTH_MODE=disabled" in hint
    for mode in ("token", "disabled"):
        assert token_auth_hint({"RAY_AUTH_MODE": mode}, tmp_path) is None


def test_the_token_path_variable_names_the_file(tmp_path: Path) -> None:
    """RAY_AUTH_TOKEN_PATH, where Ray looks in place of ~/.ray/auth_token, is where the hint looks."""
    elsewhere = tmp_path / "token"
    environ = {"RAY_AUTH_TOKEN_PATH": str(elsewhere)}
    assert token_auth_hint(environ, tmp_path) is None
    elsewhere.write_text("0123456789abcdef")
    hint = token_auth_hint(environ, tmp_path)
    assert hint is not None
    assert str(elsewhere) in hint
