"""The CLI contract: commands, output and exit codes.

Most commands run in-process (``main`` with an argv, its stdout, stderr and exit code
captured): a fresh interpreter per case cost 2-3 s of import at CI's load and proved
nothing more. What only a real process shows stays a subprocess: the console script,
Ctrl-C's exit 130, and the MCP server ending when its client's pipes close.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._cli import Cli, bash_agent

ROOT = Path(__file__).parents[2]
EXAMPLE = str(ROOT / "examples" / "field-guide")
MOUNT = f"/data={ROOT / 'examples' / 'sample-data'}"


def test_check_valid_agent(cli: Cli) -> None:
    """check exits 0 for a valid agent folder."""
    done = cli("check", EXAMPLE)
    assert done.returncode == 0, done.stderr
    assert "field-guide: ok" in done.stdout


def test_check_invalid_agent(cli: Cli, tmp_path: Path) -> None:
    """check prints the ConfigError text on stderr and exits 2."""
    (tmp_path / "vessel.toml").write_text("[tools]\nbuiltin = ['cat']\n")
    done = cli("check", str(tmp_path))
    assert done.returncode == 2
    assert "vessel.toml: tools.builtin: unknown built-in 'cat'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("dialect", "key"),
    [("openai", "function"), ("anthropic", "input_schema"), ("mcp", "inputSchema")],
)
def test_tools_prints_schemas(cli: Cli, dialect: str, key: str) -> None:
    """tools prints the schemas of the chosen dialect as JSON."""
    done = cli("tools", EXAMPLE, "--dialect", dialect)
    assert done.returncode == 0, done.stderr
    schemas = json.loads(done.stdout)
    assert all(key in s for s in schemas)
    assert len(schemas) == 6


def test_tools_default_dialect_and_scope_filter(cli: Cli) -> None:
    """tools defaults to openai and filters by --scope."""
    done = cli("tools", EXAMPLE, "--scope", "tools:files")
    names = [s["function"]["name"] for s in json.loads(done.stdout)]
    assert names == ["read", "glob", "list"]


def test_call_runs_species_in_a_sandbox(cli: Cli) -> None:
    """call runs the example in the default confined backend and prints the result text."""
    done = cli("call", EXAMPLE, "species", '{"habitat": "estuaries"}', "--mount", MOUNT)
    assert done.returncode == 0, done.stderr
    names = [row["name"] for row in json.loads(done.stdout)]
    assert names == ["Pied avocet", "Eurasian curlew", "Grey heron", "Harbour seal"]


def test_call_reads_arguments_from_stdin_and_prints_json(cli: Cli) -> None:
    """'-' reads the arguments from stdin; --json prints the whole result."""
    done = cli(
        "call",
        EXAMPLE,
        "word_count",
        "-",
        "--mount",
        MOUNT,
        "--json",
        stdin='{"path": "species/eel.md"}',
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["text"] == "species/eel.md: 35 words\n"
    for key in ("text", "is_error", "exit_code", "timed_out", "dropped_chars", "files"):
        assert key in result
    assert result["backend"] != "unconfined"


def test_call_relax_gives_up_a_promise_as_the_api_does(cli: Cli) -> None:
    """--relax PROMISE reaches the executor: the result's policy identity records it."""
    args = ["call", EXAMPLE, "word_count", '{"path": "species/eel.md"}', "--mount", MOUNT, "--json"]
    strict, relaxed = cli(*args), cli(*args, "--relax", "process-limit")
    assert strict.returncode == relaxed.returncode == 0, strict.stderr + relaxed.stderr
    strict_id, relaxed_id = (json.loads(d.stdout)["policy_id"] for d in (strict, relaxed))
    assert strict_id
    assert relaxed_id
    assert strict_id != relaxed_id


def test_call_eval_relaxations_reach_the_turn(cli: Cli, tmp_path: Path) -> None:
    """--writable-root --root-identity give the call uid 0 and a writable /usr; policy_id shows it."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "vessel.toml").write_text('[tools]\nbuiltin = ["bash"]\n')
    for path in (tmp_path, agent):
        path.chmod(0o755)
    command = '{"command": "id -u; touch /usr/local/bin/av-cli && echo wrote"}'
    args = ["call", str(agent), "bash", "-", "--json"]
    strict = cli(*args, stdin=command)
    relaxed = cli(*args, "--writable-root", "--root-identity", stdin=command)
    strict_result, relaxed_result = (json.loads(d.stdout) for d in (strict, relaxed))
    assert relaxed.returncode == 0, relaxed.stderr + relaxed_result["text"]
    assert relaxed_result["text"].split()[:2] == ["0", "wrote"]
    assert strict_result["text"].split()[0] == "65534"
    assert "wrote" not in strict_result["text"]
    assert strict_result["policy_id"] != relaxed_result["policy_id"]


def test_call_warns_when_the_workdir_has_no_mount(cli: Cli) -> None:
    """An agent whose workdir no --mount serves is warned about on stderr, not answered silently."""
    done = cli("call", EXAMPLE, "list", "{}")
    assert done.returncode == 0, done.stderr
    assert (
        "astralvessel: warning: the agent's workdir /data has no mount, so its tools see an "
        "empty folder there; give one with --mount /data=HOST_PATH"
    ) in done.stderr
    served = cli("call", EXAMPLE, "list", "{}", "--mount", MOUNT)
    assert "warning" not in served.stderr


def test_call_error_result_exits_1(cli: Cli) -> None:
    """A result that is an error exits 1 and still prints its text."""
    done = cli("call", EXAMPLE, "species", '{"habitat": 3}', "--mount", MOUNT)
    assert done.returncode == 1
    assert done.stdout.startswith("Error: invalid arguments for species at 'habitat'")


@pytest.mark.parametrize(
    "args",
    [
        ["call", EXAMPLE, "species", "--backend", "no-such-backend"],
        ["call", "/nonexistent/agent", "species"],
        ["call", EXAMPLE, "species", "--mount", "data"],
        ["call", EXAMPLE, "species", "--scope", "tools:root"],
        ["call", EXAMPLE, "species", "--frobnicate"],
        ["call", EXAMPLE, "species", "--relax", "teleportation"],
        ["tools", EXAMPLE, "--dialect", "gemini"],
    ],
)
def test_host_errors_exit_2_with_one_line(cli: Cli, args: list[str]) -> None:
    """Bad backends, folders, mounts, scopes and flags exit 2 with one clear line, no traceback."""
    done = cli(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip()
    assert len(done.stderr.strip().splitlines()) <= 2


def test_console_script_matches_module() -> None:
    """The installed astralvessel command behaves like python -m astralvessel."""
    script = Path(sys.executable).with_name("astralvessel")
    done = subprocess.run(
        [str(script), "check", EXAMPLE], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0


def test_ctrl_c_exits_130_with_one_line(tmp_path: Path) -> None:
    """SIGINT during a call ends the CLI with exit 130 and one line, no traceback."""
    import signal
    import time

    agent = bash_agent(tmp_path)
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    command = json.dumps({"command": "touch /out/started; sleep 60"})
    # A background job of a non-interactive shell (nohup'd CI, ``cmd &``) starts with SIGINT
    # ignored, and a child inherits that: give the CLI the disposition a terminal's has.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "astralvessel", "call", str(agent), "bash", command),
                *("--mount", f"/out={out}:rw", "--backend", "bubblewrap"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 60
    while not (out / "started").exists() and process.poll() is None:
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, (stdout, stderr)
    assert stderr.strip() == "astralvessel: interrupted"


def test_json_names_outbox_files_that_exist_after_exit(cli: Cli, tmp_path: Path) -> None:
    """--json names outbox files that still exist when the CLI has exited, under --outbox."""
    agent = bash_agent(tmp_path)
    command = json.dumps({"command": 'printf report > "$VESSEL_OUTBOX/r.txt"'})
    for extra in ([], ["--outbox", str(tmp_path / "kept")]):
        done = cli("call", str(agent), "bash", command, "--json", *extra)
        assert done.returncode == 0, done.stderr
        (file,) = json.loads(done.stdout)["files"]
        assert Path(file["path"]).read_text() == "report"
        if extra:
            assert Path(file["path"]).is_relative_to(tmp_path / "kept")
        else:
            assert "outbox files kept in" in done.stderr


def test_hostile_arguments_are_an_error_result_not_a_traceback(cli: Cli, tmp_path: Path) -> None:
    """Deeply nested JSON arguments exit 1 with a refusal the model can act on."""
    done = cli("call", str(bash_agent(tmp_path)), "bash", "[" * 100_000)
    assert done.returncode == 1
    assert done.stdout.startswith("Error: the arguments for bash are not valid JSON")
    assert "Traceback" not in done.stderr


def test_check_rejects_a_huge_vessel_file_by_its_size(cli: Cli, tmp_path: Path) -> None:
    """A 100 MB vessel.toml is refused by its size with one problem, exit 2."""
    agent = bash_agent(tmp_path)
    with (agent / "vessel.toml").open("r+b") as stream:
        stream.truncate(100 << 20)
    done = cli("check", str(agent))
    assert done.returncode == 2
    assert "vessel.toml: larger than 1048576 bytes" in done.stderr


def test_check_fails_a_dangling_ref(cli: Cli, tmp_path: Path) -> None:
    """check fails a tool whose parameters schema has a $ref that resolves nowhere."""
    agent = bash_agent(tmp_path)
    (agent / "vessel.toml").write_text('[tools]\ndeclared = ["t.toml"]\n')
    (agent / "t.toml").write_text(
        'name = "t"\ndescription = "d"\ncommand = ["true"]\n'
        '[parameters]\ntype = "object"\n[parameters.properties.v]\n"$ref" = "#/$defs/gone"\n'
    )
    done = cli("check", str(agent))
    assert done.returncode == 2
    assert "t.toml: parameters: cannot be used to check arguments" in done.stderr


def test_mcp_server_ends_quietly_when_the_client_vanishes(tmp_path: Path) -> None:
    """A client that dies mid-call ends `astralvessel mcp` with no traceback on stderr."""
    agent = bash_agent(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "astralvessel", "mcp", str(agent), "--backend", "bubblewrap"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdin is not None
    assert process.stdout is not None

    def send(message: dict[str, object]) -> None:
        assert process.stdin is not None
        process.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        process.stdin.flush()

    send(
        {
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2024-11-05",
                "capabilities": {},
                "clientInfo": {"name": "vanishing", "version": "1"},
            },
        }
    )
    assert b'"id":1' in process.stdout.readline()
    send({"method": "notifications/initialized"})
    call = {"name": "bash", "arguments": {"command": "sleep 1; echo late"}}
    send({"id": 2, "method": "tools/call", "params": call})
    process.stdout.close()
    process.stdin.close()
    assert process.wait(timeout=60) == 0
    assert process.stderr is not None
    stderr = process.stderr.read()
    process.stderr.close()
    assert b"Traceback" not in stderr


def test_doctor_names_each_limits_mechanism(cli: Cli) -> None:
    """doctor lists every built-in backend and says, per backend, what holds memory, disk,
    inodes, processes and open files here (a probe starts trial turns: one test, two runs)."""
    from astralvessel.sandbox._cgroup import memory_mount
    from astralvessel.sandbox._hostinfo import collect_host_facts

    done = cli("doctor", "--json")
    assert done.returncode == 0, done.stderr
    reports = {r["name"]: r for r in json.loads(done.stdout)}
    assert {"bubblewrap", "nsjail", "docker", "docker-exec", "unconfined"} <= set(reports)
    cgroup_here = memory_mount(collect_host_facts()) is not None
    for name in ("bubblewrap", "nsjail", "docker", "docker-exec"):
        mechanisms = reports[name]["mechanisms"]
        assert list(mechanisms) == [
            *("memory", "disk", "inodes", "processes", "open files", "kernel memory")
        ]
        assert "RLIMIT_SIGPENDING 1024 per call" in mechanisms["kernel memory"]
        assert "nr_inodes=" in mechanisms["inodes"]
        assert "size=" in mechanisms["disk"]
        assert "RLIMIT_AS per process" in mechanisms["memory"]
        assert "RLIMIT_NOFILE" in mechanisms["open files"]
    bwrap = reports["bubblewrap"]["mechanisms"]["memory"]
    assert "memory watch" in bwrap
    assert ("cgroup v1 memory group" in bwrap) is cgroup_here
    assert ("no memory cgroup" in bwrap) is not cgroup_here
    assert "memory watch" not in reports["docker-exec"]["mechanisms"]["memory"]
    # The server runs docker's calls, so its watch bounds them; docker-exec has none.
    assert "memory watch" in reports["docker"]["mechanisms"]["memory"]
    assert "turn's own host uid" in reports["docker-exec"]["mechanisms"]["processes"]
    # As root on this cgroup v1 host the turn's group bounds TCP buffers too; Docker's not.
    kernel = {name: reports[name]["mechanisms"].get("kernel memory", "") for name in reports}
    assert ("TCP buffers up to memory_mb" in kernel["bubblewrap"]) is cgroup_here
    assert "memory watch" not in kernel["docker-exec"]
    text = cli("doctor")
    assert text.returncode == 0, text.stderr
    assert "  limit inodes: the workspace tmpfs's nr_inodes=" in text.stdout
    # How a turn opens from a snapshot: an overlay where this kernel serves one (6.x here),
    # a copy by the file worker elsewhere; nothing on docker-exec.
    for name in ("bubblewrap", "nsjail"):
        assert reports[name]["snapshots"].startswith("copy-on-write (an overlay")
    # Docker's overlay is the host's own mount, which only root can make.
    docker = "copy-on-write (an overlay" if os.geteuid() == 0 else "copy (the file worker"
    assert reports["docker"]["snapshots"].startswith(docker)
    assert reports["docker-exec"]["snapshots"].startswith("none (no sandbox server")
    docker_overlay = int(docker.startswith("copy-on-write"))
    assert text.stdout.count("  snapshots: copy-on-write (") == 2 + docker_overlay
    assert text.stdout.count("  snapshots: copy (") == 2 - docker_overlay


def test_network_host_pins_reach_the_executor(cli: Cli, tmp_path: Path) -> None:
    """--network-host NAME=ADDRESS reaches Executor(network_hosts=): an unlisted name is the
    host's error (exit 2, naming it), a malformed pin is refused by the parser."""
    agent = bash_agent(tmp_path)
    done = cli(
        "call", str(agent), "bash", '{"command": "true"}', "--network-host", "wiki.test=10.0.0.5"
    )
    assert done.returncode == 2
    assert "network_hosts: 'wiki.test' is not on the network allow-list" in done.stderr
    malformed = cli("call", str(agent), "bash", "{}", "--network-host", "wiki.test")
    assert malformed.returncode == 2
    assert "write NAME=ADDRESS" in malformed.stderr
