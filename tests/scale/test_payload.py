"""The server's payload: compiled code for the host's own interpreter, source for any other."""

from __future__ import annotations

import marshal
import subprocess
import sys

from astralvessel.sandbox._session import server_command, server_payload
from astralvessel.sandbox.server import _protocol

# What a server that booted says to a request sent before hello.
BOOTED = b"expected 'hello' first"


def boot(payload: dict[str, object]) -> subprocess.CompletedProcess[bytes]:
    """Run the bootstrap on this interpreter with ``payload``, then one request before hello."""
    data = marshal.dumps(payload, 4)
    argv = [*server_command(sys.executable)[:-1], str(len(data))]
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
