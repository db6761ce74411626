"""Why joining a Ray cluster by its address failed: token auth on the cluster, not here.

Ray 2.60 turns token authentication on by itself in two places. A local
``ray.init()`` that starts a cluster writes a token to ``~/.ray/auth_token``;
a later ``ray start`` on that machine finds the token there and turns token
auth on for its cluster, unless ``RAY_AUTH_MODE`` is set. A process that
joins by an explicit address (``address=``, ``RAY_ADDRESS``) does neither:
with ``RAY_AUTH_MODE`` unset it sends no token, the cluster answers every
request with ``InvalidAuthToken`` (Ray logs it, once a second), and after
about 20 s ``ray.init`` raises a bare ``ConnectionError``, whose cause (a
``RuntimeError`` quoting the last attempt's traceback) names the refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["token_auth_hint"]

#: The variable that sets Ray's authentication mode (``token`` or ``disabled``).
AUTH_MODE = "RAY_AUTH_MODE"
#: The variable that names the token's file, in place of ``~/.ray/auth_token``.
KEY_FILE_VARIABLE = "RAY_AUTH_TOKEN_PATH"
#: The status the cluster refuses a request without the right token with.
REFUSAL = "InvalidAuthToken"


def _refused(error: BaseException) -> bool:
    """Whether ``error`` or an error it came from says the cluster refused this process's token."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if REFUSAL in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def token_auth_hint(error: BaseException, environ: Mapping[str, str], home: Path) -> str | None:
    """What to do when joining a cluster failed with ``error`` because the cluster asks for a
    token this process did not send (or sent wrong), else None.

    Where this process leaves the mode unset and a token file exists, that file
    is the likely cause: a ``ray start`` on this machine found it and turned
    token auth on.
    """
    if not _refused(error):
        return None
    named = environ.get(KEY_FILE_VARIABLE)
    token = home / ".ray" / "auth_token" if named is None else Path(named)
    ways_out = (
        f"set {AUTH_MODE}=token here, with the cluster's token in {token} (or "
        f"{KEY_FILE_VARIABLE}, or RAY_AUTH_TOKEN), or start the cluster with {AUTH_MODE}=disabled"
    )
    if AUTH_MODE not in environ and token.is_file():
        return (
            f"the cluster refused this process ({REFUSAL}): it asks for a token and this "
            f"process, joining by address with {AUTH_MODE} unset, sends none. {token} exists: "
            "a `ray start` on a machine holding that file (any local ray.init() writes it) "
            f"turns token auth on for its cluster. To join, {ways_out}"
        )
    return f"the cluster refused this process's token ({REFUSAL}). To join, {ways_out}"
