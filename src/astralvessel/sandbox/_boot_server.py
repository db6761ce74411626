"""The sandbox server's first code on every backend: read the payload, load it, run main.

``_astralvessel_serve`` is what ``_session.server_command`` runs in the
sandbox's ``python -I -S -B -c``, and ``_astralvessel_compile`` what
``_server_code.compile_command`` runs to have a sandbox's own Python compile
the server's modules. Neither is imported to run: each function's source is
sent as text (``_sent_text.function_text``), followed by one line that calls
it. So they are standard library only, parse as Python 3.8, keep their types
in comments (an annotation would be evaluated there), and use nothing of this
module but their parameters.
"""

from __future__ import annotations


# Reads exactly argv[1] bytes of the payload with os.readv into one buffer of that size (a
# buffered read could swallow the frames behind it; appending each read to the bytes read
# so far copies them again every time: 3.9 ms of the server's CPU for 0.6 MB, 0.9 this
# way), makes each module in a private package, runs main. The payload is a marshal of
# plain values (format 4, which every Python 3.4+ reads: json would cost the start-up its
# import of re and enum). It carries each module twice: as source, and compiled by the
# host's interpreter (a marshal of code objects). A server on the very same interpreter
# build (bubblewrap and nsjail run the host's own) loads the compiled code in about a
# millisecond, where compiling 130 kB of source is most of a cold turn start; any other
# Python (a Docker image's) compiles the source. Both compile with optimize=2: the server
# has no assert and never reads a docstring; without them the compiled code is 56 kB
# smaller (an idle turn's PSS, measured A/B, moved by less than 0.05 MiB).
# Before main, the payload is dropped and what is loaded frozen out of the collector's
# reach: the server forks its helpers, and a collection in them would copy the pages they
# share. A third argument is a seccomp program in hex that the bootstrap installs (with
# no_new_privs) before it reads anything: nsjail's server takes its x32 refusal so (see
# ``x32_guard``), and a failure ends the server before any of its code runs.
# When main returns (its calls and helpers are gone), the process leaves with os._exit:
# tearing down the interpreter's modules takes milliseconds of every turn's close for
# nothing, since no Python code of the server has anything left to do.
def _astralvessel_serve(package):  # type: (str) -> None  # noqa: PLR0915
    import marshal
    import os
    import sys
    import types

    if sys.argv[2:]:
        import ctypes
        import struct

        program = bytes.fromhex(sys.argv[2])
        buffer = ctypes.create_string_buffer(program, len(program))
        libc = ctypes.CDLL(None, use_errno=True)
        ulong = ctypes.c_ulong
        fprog = struct.pack("HP", len(program) // 8, ctypes.addressof(buffer))
        # PR_SET_NO_NEW_PRIVS (38), then PR_SET_SECCOMP (22) in SECCOMP_MODE_FILTER (2).
        if libc.prctl(38, ulong(1), ulong(0), ulong(0), ulong(0)) or libc.prctl(
            22, ulong(2), fprog, ulong(0), ulong(0)
        ):
            error = os.strerror(ctypes.get_errno())
            sys.exit("astralvessel server: cannot install its filter: " + error)
        del ctypes, struct, program, buffer, libc, ulong, fprog
    size = int(sys.argv[1])
    data = bytearray(size)
    view = memoryview(data)
    done = 0
    while done < size:
        read = os.readv(0, [view[done:]])
        if not read:
            sys.exit("astralvessel server: payload cut short")
        done += read
    payload = marshal.loads(data)  # noqa: S302 - the host's own payload
    view.release()
    code = None
    if payload["tag"] == [sys.hexversion, sys.implementation.cache_tag]:
        code = marshal.loads(payload["code"])  # noqa: S302 - likewise
    p = types.ModuleType(package)
    p.__path__ = []
    sys.modules[package] = p
    for name, source in payload["src"].items():
        module = types.ModuleType(package + "." + name)
        module.__package__ = package
        sys.modules[module.__name__] = module
        setattr(p, name, module)
        try:
            if code:
                body = code[name]
            else:
                body = compile(source, package + "/" + name + ".py", "exec", optimize=2)
            exec(body, module.__dict__)  # noqa: S102 - the server's own code
        except ImportError:  # an optional module (_seccomp, _files): the server says it lacks it
            del sys.modules[module.__name__]
            delattr(p, name)
    # main's frame is this one: what it no longer needs goes before it runs.
    del data, view, payload, code, name, source, module, body
    import gc

    gc.freeze()
    p._main.main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# Compiles the modules given as name, source, name, source... exactly as the host's
# ``_server_code._compiled`` does, and prints the interpreter's tag and the code (marshal,
# base64). The sources are checked to parse as Python 3.8, so an older interpreter is
# refused (status 3) before that; this text itself must parse on it, so it has no f-string.
def _astralvessel_compile(package):  # type: (str) -> None
    import sys

    if sys.version_info < (3, 8):  # noqa: UP036 - a sandbox's Python, not the host's
        sys.exit(3)
    import __future__

    import binascii
    import marshal

    given = sys.argv[1:]
    code = {}
    flags = __future__.annotations.compiler_flag
    for i in range(0, len(given), 2):
        path = package + "/" + given[i] + ".py"
        code[given[i]] = compile(given[i + 1], path, "exec", flags, True, 2)
    tag = "%d %s\n" % (sys.hexversion, sys.implementation.cache_tag)  # noqa: UP031
    sys.stdout.write(tag + binascii.b2a_base64(marshal.dumps(code)).decode())
