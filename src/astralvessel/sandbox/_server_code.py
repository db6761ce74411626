"""The sandbox server's own code, as the host sends it: the bootstrap, the payload, and
the argv that starts the server or has a sandbox's Python compile it.

The bootstrap and the compile step are functions of ``_boot_server``, a real module,
sent as their text (``_sent_text``).

Every built-in backend starts the same server inside its sandbox with
``_session.server_command(python)`` and writes ``server_payload()`` to its stdin first:
the server's modules travel as source (and compiled), so nothing has to be
mounted and any Python 3.8+ in the sandbox will do. See ``docs/sandbox-server.md``.
"""

from __future__ import annotations
import __future__

import base64
import functools
import marshal
import sys
from collections.abc import Mapping
from importlib import resources
from types import CodeType

import attrs

from ._sent_text import function_text

__all__ = [
    "BOOTSTRAP",
    "SERVER_MODULES",
    "ServerBuild",
    "compile_command",
    "parse_build",
    "server_payload",
]

#: The server's modules, in the order they are executed (each may import those before it).
#: ``_seccomp`` and ``_files`` are optional: the server reports what it lacks.
SERVER_MODULES = (
    "_lean",
    "_protocol",
    "_messages",
    "_sys",
    "_seccomp",
    "_userns",
    "_launch",
    "_init",
    "_probe",
    "_rootfs",
    "_lowerfs",
    "_kernelmem",
    "_bounds",
    "_zygote",
    "_paths",
    "_viewtext",
    "_readview",
    "_globview",
    "_listview",
    "_files",
    "_snapfiles",
    "_fsops",
    "_outbox",
    "_worker",
    "_relay",
    "_calls",
    "_freeze",
    "_heldfs",
    "_pipes",
    "_fsqueue",
    "_hello",
    "_spawner",
    "_passfd",
    "_adopt",
    "_main",
)
_PACKAGE = "_astralvessel_server"
#: The payload's marshal format: 4 is what Python 3.4 and every later version read.
_PAYLOAD_MARSHAL = 4

#: The argv's program that starts the server: ``_boot_server._astralvessel_serve``, sent as text.
BOOTSTRAP = function_text(__package__, "_boot_server", "_astralvessel_serve") + (
    f"_astralvessel_serve({_PACKAGE!r})\n"
)


@functools.cache
def _sources() -> tuple[tuple[str, str], ...]:
    """Each server module's name and source, in ``SERVER_MODULES`` order."""
    package = resources.files("astralvessel.sandbox.server")
    found = []
    for name in SERVER_MODULES:
        source = package / f"{name}.py"
        if source.is_file():
            found.append((name, source.read_text(encoding="utf-8")))
    return tuple(found)


@functools.cache
def server_payload(build: ServerBuild | None = None) -> bytes:
    """Return the bytes to write to the server's stdin before anything else: its own code.

    The code is compiled by this interpreter, or taken from ``build`` (the
    modules compiled by the sandbox's own Python, see ``compile_command``).
    """
    sources = dict(_sources())
    if build is None:
        build = ServerBuild(
            hexversion=sys.hexversion,
            cache_tag=sys.implementation.cache_tag,
            code=marshal.dumps(_compiled(sources)),
        )
    else:
        # The sandbox's own Python compiled this code, so its tag matches and the sources,
        # the fallback for an interpreter that differs, are never read: send their names
        # only (on Docker the payload crosses the engine, 40% less of it per turn start).
        sources = dict.fromkeys(sources, "")
    payload = {"tag": [build.hexversion, build.cache_tag], "code": build.code, "src": sources}
    return marshal.dumps(payload, _PAYLOAD_MARSHAL)


@attrs.frozen
class ServerBuild:
    """The server's modules compiled by one interpreter: its ``sys.hexversion``, its
    ``sys.implementation.cache_tag``, and a marshal of each module's code object."""

    hexversion: int = attrs.field(validator=attrs.validators.instance_of(int))
    cache_tag: str = attrs.field(validator=attrs.validators.instance_of(str))
    code: bytes = attrs.field(validator=attrs.validators.instance_of(bytes), repr=False)


#: The argv's program that compiles the server's modules: ``_boot_server._astralvessel_compile``.
_COMPILE = function_text(__package__, "_boot_server", "_astralvessel_compile") + (
    f"_astralvessel_compile({_PACKAGE!r})\n"
)


def compile_command(python: str) -> list[str]:
    """The argv that has ``python`` (in a sandbox) compile the server's modules.

    What it prints is read with ``parse_build``. It exits with status 3 on a
    Python older than 3.8, which cannot run the server. The sources travel as
    arguments, each well under the kernel's 128 KiB a string.
    """
    argv = [python, "-I", "-S", "-B", "-c", _COMPILE]
    for name, source in _sources():
        argv += [name, _without_future_import(source)]
    return argv


def parse_build(output: bytes) -> ServerBuild | None:
    """What ``compile_command`` printed, or None if it is not that (the turn then compiles)."""
    head, _, body = output.partition(b"\n")
    fields = head.decode("ascii", "replace").split()
    if len(fields) != 2 or not fields[0].isdigit():
        return None
    try:
        code = base64.b64decode(body.strip(), validate=True)
    except ValueError:
        return None
    return ServerBuild(hexversion=int(fields[0]), cache_tag=fields[1], code=code) if code else None


#: Every server module's future statement (the idle tests check the server imports no
#: ``__future__``, so a module that spells it otherwise fails there).
_FUTURE_IMPORT = "from __future__ import annotations\n"


def _without_future_import(source: str) -> str:
    """``source`` with its future statement blanked (its lines keep their numbers).

    Compiled code keeps a future statement as a runtime import of ``__future__.py``
    (0.4 ms of every turn start): the compiled modules get the flag from ``compile``
    instead. The source sent as the fallback keeps its statement.
    """
    return source.replace(_FUTURE_IMPORT, "\n", 1)


def _compiled(sources: Mapping[str, str]) -> dict[str, CodeType]:
    """Each module's code as ``compile_command``'s would be, without this module's futures
    but postponed annotations (given as a flag, not imported: ``_without_future_import``)."""
    flags = __future__.annotations.compiler_flag
    return {
        name: compile(
            _without_future_import(text),
            f"{_PACKAGE}/{name}.py",
            "exec",
            flags=flags,
            dont_inherit=True,
            optimize=2,
        )
        for name, text in sources.items()
    }
