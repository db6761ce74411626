"""The sandbox server's own code, as the host sends it: the bootstrap, the payload, and
the argv that starts the server or has a sandbox's Python compile it.

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
    "_pipes",
    "_fsqueue",
    "_hello",
    "_spawner",
    "_main",
)
_PACKAGE = "_astralvessel_server"
#: The payload's marshal format: 4 is what Python 3.4 and every later version read.
_PAYLOAD_MARSHAL = 4

# Reads exactly argv[1] bytes of the payload with os.readv into one buffer of that size (a
# buffered read could swallow the frames behind it; appending each read to the bytes read
# so far copies them again every time: 3.9 ms of the server's CPU for 0.6 MB, 0.9 this
# way), makes each module in a private package, runs main. The payload is
# a marshal of plain values (format 4, which every Python 3.4+ reads: json would cost the
# start-up its import of re and enum). It carries each module twice: as source, and
# compiled by the host's interpreter (a marshal of code objects). A server on the very same
# interpreter build (bubblewrap and nsjail run the host's own) loads the compiled code in
# about a millisecond, where compiling 130 kB of source is most of a cold turn start; any
# other Python (a Docker image's) compiles the source. Both compile with optimize=2: the
# server has no assert and never reads a docstring; without them the compiled code is 56 kB
# smaller (an idle turn's PSS, measured A/B, moved by less than 0.05 MiB).
# Before main, the payload is dropped and what is loaded frozen out of the collector's reach:
# the server forks its helpers, and a collection in them would copy the pages they share.
# A third argument is a seccomp program in hex that the bootstrap installs (with
# no_new_privs) before it reads anything: nsjail's server takes its x32 refusal so (see
# ``x32_guard``), and a failure ends the server before any of its code runs.
# When main returns (its calls and helpers are gone), the process leaves with os._exit:
# tearing down the interpreter's modules takes milliseconds of every turn's close for
# nothing, since no Python code of the server has anything left to do.
BOOTSTRAP = f"""\
import os,sys,marshal,types
if sys.argv[2:]:
 import ctypes as C,struct;f=bytes.fromhex(sys.argv[2]);g=C.create_string_buffer(f,len(f))
 l=C.CDLL(None,use_errno=True);u=C.c_ulong;p=struct.pack('HP',len(f)//8,C.addressof(g))
 if l.prctl(38,u(1),u(0),u(0),u(0)) or l.prctl(22,u(2),p,u(0),u(0)):
  sys.exit('astralvessel server: cannot install its filter: '+os.strerror(C.get_errno()))
 del C,struct,f,g,l,u,p
n=int(sys.argv[1]);b=bytearray(n);v=memoryview(b);i=0
while i<n:
 c=os.readv(0,[v[i:]])
 if not c:sys.exit('astralvessel server: payload cut short')
 i+=c
d=marshal.loads(b);c=None;v.release()
if d['tag']==[sys.hexversion,sys.implementation.cache_tag]:c=marshal.loads(d['code'])
P={_PACKAGE!r};p=types.ModuleType(P);p.__path__=[];sys.modules[P]=p
for k,v in d['src'].items():
 m=types.ModuleType(P+'.'+k);m.__package__=P;sys.modules[m.__name__]=m;setattr(p,k,m)
 try:exec(c[k] if c else compile(v,P+'/'+k+'.py','exec',optimize=2),m.__dict__)
 except ImportError:del sys.modules[m.__name__];delattr(p,k)
del b,c,d,i,k,v,m
import gc;gc.freeze()
p._main.main()
sys.stdout.flush();sys.stderr.flush();os._exit(0)
"""


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


# Compiles the modules given as name, source, name, source... exactly as the host's
# ``_compiled`` does, and prints the interpreter's tag and the code (marshal, base64). The
# sources are checked to parse as Python 3.8, so the interpreter is refused before that.
_COMPILE = f"""\
import sys,marshal,binascii,__future__
if sys.version_info<(3,8):sys.exit(3)
a=sys.argv[1:];c={{}};f=__future__.annotations.compiler_flag
for i in range(0,len(a),2):
 c[a[i]]=compile(a[i+1],{_PACKAGE!r}+'/'+a[i]+'.py','exec',f,True,2)
t=sys.implementation.cache_tag
sys.stdout.write('%d %s\\n'%(sys.hexversion,t)+binascii.b2a_base64(marshal.dumps(c)).decode())
"""


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
