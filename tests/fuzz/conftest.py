"""A real turn on every confined backend, for hostile-input and fuzz tests.

The agent has every built-in, a json-stdin tool that prints what it is told to
(output, outbox files) and an args-mode tool, so one turn can be attacked through
arguments, output and the outbox alike.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import astralvessel as av
from astralvessel.sandbox import Limits

#: Every backend the hostile-input suite runs on; one that cannot run here fails.
BACKENDS = ["bubblewrap", "nsjail", "docker"]

# Does what its JSON says: print text (bytes, as latin-1), make outbox entries.
EMIT = r"""
import json, os, sys
order = json.load(sys.stdin)
outbox = os.environ["VESSEL_OUTBOX"]
for name, size in order.get("files", []):
    path = os.path.join(outbox.encode(), name.encode())
    with open(path, "wb") as f:
        f.write(b"x" * size)
for hex_name, size in order.get("raw", []):  # names as hex: any bytes, UTF-8 or not
    with open(os.path.join(outbox.encode(), bytes.fromhex(hex_name)), "wb") as f:
        f.write(b"x" * size)
for name in order.get("dirs", []):
    os.makedirs(os.path.join(outbox, name), exist_ok=True)
if order.get("nest"):
    os.chdir(outbox)
    for _ in range(order["nest"]):
        os.mkdir(".nest")
        os.chdir(".nest")
    os.chdir("/")
if order.get("sleep"):
    import time
    time.sleep(order["sleep"])
out = order.get("out", "")
sys.stdout.buffer.write(out.encode("latin-1", "replace") * order.get("repeat", 1))
sys.exit(order.get("exit", 0))
"""

VESSEL = """
name = "hostile"
tool_timeout_seconds = 60
tool_output_chars = 2000
scopes = ["tools:read", "tools:files", "tools:search", "tools:execute"]
[tools]
builtin = ["read", "grep", "glob", "list", "bash"]
declared = ["tools/emit.toml", "tools/flags.toml"]
[limits]
disk_mb = 64
"""

EMIT_TOOL = """
name = "emit"
description = "Print what it is told and leave outbox files."
command = ["python3", "{package}/tools/emit.py"]
"""

FLAGS_TOOL = """
name = "flags"
description = "Print its flags."
command = ["/bin/echo"]
input = "args"
[parameters]
type = "object"
[parameters.properties.v]
type = "string"
"""


@pytest.fixture(scope="module")
def agent_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hostile suite's agent folder, world-readable as a shipped one would be."""
    root = tmp_path_factory.mktemp("hostile")
    folder = root / "agent"
    (folder / "tools").mkdir(parents=True)
    (folder / "vessel.toml").write_text(textwrap.dedent(VESSEL))
    (folder / "tools" / "emit.toml").write_text(textwrap.dedent(EMIT_TOOL))
    (folder / "tools" / "flags.toml").write_text(textwrap.dedent(FLAGS_TOOL))
    (folder / "tools" / "emit.py").write_text(EMIT)
    for path in (root, folder, folder / "tools"):
        path.chmod(0o755)
    return folder


@pytest.fixture(scope="module", params=BACKENDS)
def executor(request: pytest.FixtureRequest, agent_folder: Path) -> av.Executor:
    """An executor for the hostile agent on the backend under test."""
    registry = av.Registry.for_agent(av.Agent.load(agent_folder))
    return av.Executor(registry, sandbox=request.param, limits=Limits(disk_mb=64))


@pytest.fixture
def turn(executor: av.Executor) -> Iterator[av.Turn]:
    """A fresh turn, closed after the test."""
    with executor.turn() as turn:
        yield turn
