"""Property-based fuzzing of ``Turn.exec`` and the file primitives with hostile host input.

The contract: a value the sandbox cannot receive as itself raises one
``UsageError`` before anything is sent; every other value reaches the command
(argv byte for byte, env and file contents exactly), and the turn survives.
Budgets are small and derandomized, so CI runs the same examples quickly.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import astralvessel as av
from astralvessel._executor import _exec as exec_module

BUDGET = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: Any text, lone surrogates and NULs included: what a careless host might pass.
# (Built from lists: ``st.text`` never yields a lone surrogate, whatever its alphabet.)
ANY_TEXT = st.lists(
    st.characters(codec=None, exclude_categories=())
    | st.sampled_from(["\ud800", "\udcff", "\udc80", "\udfff", "\0", "\n", "=", "é"]),
    max_size=40,
).map("".join)
#: Text of os.fsdecode's kind: UTF-8 plus escapes that stand for non-UTF-8 bytes.
FS_TEXT = st.binary(max_size=60).map(os.fsdecode)

# Prints argv[1:] and the variable VALUE exactly as bytes, each NUL-terminated.
ECHO = (
    "import os, sys; out = sys.stdout.buffer; "
    "[out.write(os.fsencode(a) + b'\\0') for a in sys.argv[1:]]; "
    "out.write(os.environb.get(b'VALUE', b'-') + b'\\0')"
)


@BUDGET
@given(
    argv=st.lists(ANY_TEXT, min_size=1, max_size=4),
    env=st.dictionaries(ANY_TEXT, ANY_TEXT, max_size=3),
    cwd=st.none() | ANY_TEXT,
)
def test_any_exec_arguments_build_a_request_or_raise_usage_error(argv, env, cwd):
    """Whatever text argv, env and cwd hold, the check builds a request or raises UsageError."""
    try:
        request = exec_module.exec_request(
            argv, input=None, cwd=cwd, env=env, timeout=None, default_timeout=5.0, workdir="/data"
        )
    except av.UsageError:
        return
    for text in (*request.env, *request.env.values(), request.cwd or ""):
        text.encode("utf-8")  # JSON carries it as itself
    for part in request.argv:
        part.encode("utf-8", "surrogateescape")  # the frame carries it as bytes


@BUDGET
@given(args=st.lists(FS_TEXT.filter(lambda t: "\0" not in t), max_size=3), value=ANY_TEXT)
def test_exec_argv_and_env_reach_the_command_exactly(turn: av.Turn, args, value):
    """Non-UTF-8 argv bytes and any valid env text reach the command as sent; the rest is refused."""
    env = {"VALUE": value}
    try:
        result = turn.exec(["python3", "-c", ECHO, *args], env=env)
    except av.UsageError:
        assert "\0" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value)
        return
    assert result.returncode == 0, result.stderr
    sent = [os.fsencode(a) for a in args] + [value.encode("utf-8")]
    assert result.stdout.split(b"\0")[:-1] == sent


@BUDGET
@given(data=st.binary(max_size=5000), name=FS_TEXT.filter(lambda t: t not in ("", ".", "..")))
def test_written_files_read_back_or_are_refused(turn: av.Turn, data, name):
    """A file written under any name reads back exactly and is listed under that very name;
    only a NUL (UsageError) or a path the kernel refuses (one SandboxFileError) is not."""
    path = "/workspace/fuzz/" + name
    try:
        turn.write_file(path, data)
    except av.UsageError:
        assert "\0" in name
        return
    except av.SandboxFileError:
        assert "/" in name  # a folder of its own on the way: "a/..", a file in the way
        return
    assert turn.read_file(path) == data
    if "/" not in name:
        assert (name, "file") in turn.list_dir("/workspace/fuzz")
