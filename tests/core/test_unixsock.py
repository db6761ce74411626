"""Unix sockets bound at paths longer than a socket's address holds (``_unixsock``)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from astralvessel._ground._unixsock import MAX_ADDRESS_BYTES, bind
from astralvessel.errors import BackendUnavailableError


def test_a_long_path_is_bound_where_it_names(long_tmp: Path) -> None:
    """A socket whose path is over the address's bound is bound at that very path."""
    path = long_tmp / "server.sock"
    assert len(os.fsencode(path)) > MAX_ADDRESS_BYTES
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        bind(sock, str(path))
        assert stat.S_ISSOCK(path.stat().st_mode)
    assert os.listdir(long_tmp) == ["server.sock"]


def test_a_name_too_long_by_itself_is_a_clear_error(long_tmp: Path) -> None:
    """A socket's name that alone leaves no room is the host's error naming the path and
    the fix, not the socket module's bare OSError."""
    path = long_tmp / ("n" * 100)
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock,
        pytest.raises(BackendUnavailableError) as raised,
    ):
        bind(sock, str(path))
    assert str(path) in str(raised.value)
    assert "set TMPDIR to a shorter folder" in str(raised.value)
