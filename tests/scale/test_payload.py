"""The server's payload: compiled code for the host's own interpreter, source for any other."""

from __future__ import annotations

import marshal
import platform
import signal
import subprocess
import sys

from astralvessel.sandbox._seccomp import x32_guard
from astralvessel.sandbox._session import server_command, server_payload
from astralvessel.sandbox.server import _protocol

# What a server that booted says to a request sent before hello.
BOOTED = b"expected 'hello' first"


def boot(
    payload: dict[str, object], first_filter: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run the bootstrap on this interpreter with ``payload``, then one request before hello."""
    data = marshal.dumps(payload, 4)
    argv = server_command(sys.executable, first_filter=first_filter)
    argv[6] = str(len(data))  # after python, -I, -S, -B, -c and the bootstrap
    return subprocess.run(
        argv,
        input=data + _protocol.encode({"type": "run", "id": 1, "argv": ["true"]}),
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_the_same_interpreter_runs_the_compiled_code() -> None:
    """On the host's interpreter the server runs the code compiled by the host, not the source."""
    payload = marshal.loads(server_payload())  # noqa: S302 - our own payload
    payload["src"] = dict.fromkeys(payload["src"], "raise SystemExit('compiled source')")
    done = boot(payload)
    assert BOOTED in done.stdout, done.stderr
    assert b"compiled source" not in done.stderr


def test_another_interpreter_compiles_the_source() -> None:
    """A server on another Python (another version, a Docker image's) boots from the source."""
    payload = marshal.loads(server_payload())  # noqa: S302 - our own payload
    payload["tag"] = [0, "another-python"]
    payload["code"] = b"not a marshal of code this interpreter could load"
    done = boot(payload)
    assert BOOTED in done.stdout, done.stderr


# Appended to a module that has a docstring: it refuses to load with it kept.
DOCSTRING_CHECK = '\nif __doc__ is not None:\n    raise SystemExit("docstring kept")\n'


def test_the_compiled_code_carries_no_docstrings() -> None:
    """The host compiles the server with optimize=2: no module or function keeps its docstring."""
    payload = marshal.loads(server_payload())  # noqa: S302 - our own payload
    code = marshal.loads(payload["code"])  # noqa: S302 - our own payload
    namespace: dict[str, object] = {"__name__": "_astralvessel_server._protocol"}
    exec(code["_protocol"], namespace)  # noqa: S102 - our own module, stdlib-only
    assert namespace.get("__doc__") is None
    assert getattr(namespace["encode"], "__doc__", "missing") is None


def test_another_interpreter_compiles_without_docstrings() -> None:
    """The bootstrap compiles the source with optimize=2 too: a module's docstring is gone."""
    payload = marshal.loads(server_payload())  # noqa: S302 - our own payload
    payload["tag"] = [0, "another-python"]
    payload["code"] = b"not a marshal of code this interpreter could load"
    sources = dict(payload["src"])
    assert sources["_lean"].startswith('"""')
    sources["_lean"] += DOCSTRING_CHECK
    payload["src"] = sources
    done = boot(payload)
    assert BOOTED in done.stdout, done.stderr
    assert b"docstring kept" not in done.stderr


# Appended to a module: an x32 getpid, which a kernel without x32 answers with ENOSYS.
X32_CALL = "\nimport ctypes\nctypes.CDLL(None).syscall(ctypes.c_long(0x40000027))\n"


def test_the_first_filter_is_installed_before_the_server_code_runs() -> None:
    """With ``first_filter`` the bootstrap installs it first: the server's own code is under it."""
    guard = x32_guard("x86_64")
    if platform.machine() != "x86_64":
        assert x32_guard("aarch64") is None
        return
    assert guard is not None
    payload = marshal.loads(server_payload())  # noqa: S302 - our own payload
    payload["tag"] = [0, "another-python"]
    payload["code"] = b"not a marshal of code this interpreter could load"
    sources = dict(payload["src"])
    sources["_lean"] += X32_CALL
    payload["src"] = sources
    unguarded = boot(payload)
    assert BOOTED in unguarded.stdout, unguarded.stderr
    guarded = boot(payload, first_filter=guard)
    assert guarded.returncode == -signal.SIGSYS
    assert BOOTED not in guarded.stdout
