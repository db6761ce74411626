"""Joining a Ray cluster that refuses this process's token: the hint says so, and why."""

from __future__ import annotations

from pathlib import Path

from astralvessel.ray._auth import token_auth_hint

#: The last line of the cause Ray 2.60's ray.init(address=...) raises from, once the cluster
#: refused every attempt (the rest is a traceback and Ray's own advice).
REFUSED = (
    "Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
    "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token "
    "is missing or incorrect."
)


def _join_failure(cause: str) -> ConnectionError:
    """A ConnectionError raised from a RuntimeError saying ``cause``, as ray.init raises it."""
    error = ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:6379")
    error.__cause__ = RuntimeError(cause)
    return error


def test_a_refusal_with_a_token_file_and_the_mode_unset_names_the_file(tmp_path: Path) -> None:
    """The case a `ray start` after a local ray.init() makes: the hint names the refusal, the
    file, and both settings of RAY_AUTH_MODE."""
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("0123456789abcdef")
    hint = token_auth_hint(_join_failure(REFUSED), {}, tmp_path)
    assert hint is not None
    assert "InvalidAuthToken" in hint
    assert f"{token} exists" in hint
    assert "RAY_AUTH_MODE=token" in hint
    assert "RAY_AUTH_MODE=disabled" in hint
    # With the mode set (or no file), the refusal is still named, without the file's story.
    for environ in ({"RAY_AUTH_MODE": "token"}, {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "no")}):
        other = token_auth_hint(_join_failure(REFUSED), environ, tmp_path)
        assert other is not None
        assert "InvalidAuthToken" in other
        assert "exists" not in other


def test_a_cluster_that_is_not_there_gets_no_hint(tmp_path: Path) -> None:
    """A join that failed for any other reason is Ray's own error, whatever files exist."""
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("0123456789abcdef")
    unreachable = _join_failure("Failed to connect to GCS. Last connection error: timed out")
    assert token_auth_hint(unreachable, {}, tmp_path) is None
    assert token_auth_hint(ConnectionError("refused"), {}, tmp_path) is None
