"""Why joining a Ray cluster by its address may fail: token auth on the cluster, not here.

Ray 2.60 turns token authentication on by itself in two places. A local
``ray.init()`` that starts a cluster writes a token to ``~/.ray/auth_token``;
a later ``ray start`` on that machine finds the token there and turns token
auth on for its cluster, unless ``RAY_AUTH_MODE`` is set. A process that
joins by an explicit address (``address=``, ``RAY_ADDRESS``) does neither:
with ``RAY_AUTH_MODE`` unset it sends no token, the cluster answers every
request with ``InvalidAuthToken`` (Ray logs it, once a second), and after
about 20 s ``ray.init`` raises a bare ``ConnectionError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["token_auth_hint"]

#: The variable that sets Ray's authentication mode (``token`` or ``disabled``).
AUTH_MODE = "RAY_AUTH_MODE"
#: The variable that names the token's file, in place of ``~/.ray/auth_token``.
KEY_FILE_VARIABLE = "RAY_AUTH_TOKEN_PATH"


def token_auth_hint(environ: Mapping[str, str], home: Path) -> str | None:
    """What to do when joining a cluster failed and token auth is the likely cause, else None.

    The cause is likely when this process leaves the mode unset (so it sends no
    token) while a token file exists: the file that made a ``ray start`` here
    turn token auth on.
    """
    if AUTH_MODE in environ:
        return None
    named = environ.get(KEY_FILE_VARIABLE)
    token = home / ".ray" / "auth_token" if named is None else Path(named)
    if not token.is_file():
        return None
    return (
        f"{token} exists and {AUTH_MODE} is unset: a `ray start` on a machine holding that "
        "file (any local ray.init() writes it) turns token auth on for its cluster, and this "
        "process, joining by address, sends no token (Ray logs InvalidAuthToken). Set "
        f"{AUTH_MODE}=token here to send it, or start the cluster with {AUTH_MODE}=disabled"
    )
