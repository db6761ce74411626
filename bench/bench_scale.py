"""Benchmark: speed and scale of turns, each figure a ratio against a baseline of this same run.

The figures of issue 17, per backend, each printed next to its target:

- ``call``: one ``/bin/true`` tool call into a running turn (``turn.call``),
  against ``posix_spawn`` of ``/bin/true`` on the host, like with like: the call
  after a 20 ms pause against a spawn after the same pause (target <= 4x), and
  calls back to back against spawns back to back. The pause is a model's: its
  calls come between its steps, so the figure the target holds against is the
  paused one; but after a pause a CPU wakes from idle, which costs the spawn too
  (about 1.1 ms against 0.55-0.8 ms back to back), so the paused call's ratio to
  the back-to-back spawn is printed beside it, and so is the back-to-back call
  (a model's several calls of one step), whose ratio has no target: every call
  gets namespaces and an init of its own (see ``_spawner``), built ahead of it
  while the host pauses, which calls back to back leave no time for. The bench
  used to take a spawn right after each call; that spawn runs while the call's
  own tail (its init's exit, the next spare's forks) still holds the other
  CPU, so it measured 0.9-1.0 ms and flattered the call: not used. The samples
  alternate round by round, so a load that comes and goes moves all of them,
  not their ratios; a few rounds are taken first and dropped.
- ``cold start``: a turn's sandbox started and closed, against a one-shot
  sandbox of the same backend running ``/bin/true`` (the very command line the
  backend builds; ``docker run --rm`` for Docker); target <= 60 ms on bubblewrap
  and nsjail, <= 1.1x ``docker run`` on Docker. Beneath it, with no target, a
  turn that serves one call before its close: the server builds its spare
  after ``ready``, so only a turn that lives on pays for building and killing it.
- ``warm start + call``: with ``Executor(warm=1)``, opening a turn and its first
  call, against the same one-shot sandbox; target <= 2x.
- ``N turns at once``: N threads each open a turn and make Python tool calls;
  every error counts; target 0 errors at 128 turns. Prints p50 and p95 of a call.
- ``memory per idle turn``: the proportional set size (PSS: shared pages split
  between their users) of every process of an idle turn's sandbox, against the
  same sandbox running a bare interpreter waiting on stdin; target <= 8 MiB.
- ``memory per idle turn after calls``: the same turns measured again once each
  has served a few tool calls and ``Turn.exec`` commands (the requests those
  send) and is idle again, as a turn between a model's steps is; same target.
  Under each memory row, the same PSS per process of the turn (the sandbox
  binary's, the server, its zygote, the spare init), each with its anonymous
  part in brackets: the file-backed rest is split with every other process
  that maps the same library, so it moves with what else runs on the machine,
  while the anonymous part is the turn's own.

Run: ``python bench/bench_scale.py [--runs N] [--turns N] [backend ...]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from astralvessel import Executor, Registry, ToolSpec
from astralvessel.sandbox import ExecRequest, Policy, RunRequest, Sandbox, SandboxSession
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._discovery import get_backend
from astralvessel.sandbox._nsbackend import NamespaceBackend, _memfd
from astralvessel.sandbox._session import ServerSession

TRUE = "/bin/true"
PAUSE = 0.02
IMAGE = os.environ.get("ASTRALVESSEL_DOCKER_IMAGE", "astralvessel-test/base:bookworm")
PY = ("python3", "-c", "import sys; print(sum(range(10000)))")
TOOLS = (
    ToolSpec.command_tool("true", "Do nothing.", [TRUE]),
    ToolSpec.command_tool("py", "Run Python.", list(PY)),
)


def paired_medians(
    first: Callable[[], object], second: Callable[[], object], runs: int
) -> tuple[float, float]:
    """The medians in ms of ``first`` and ``second``, sampled in turn.

    Sampled alternately, not one series after the other, so that a machine's
    load, which changes by the second when other work runs, weighs on both alike.
    """
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        for action, into in ((first, samples[0]), (second, samples[1])):
            began = time.perf_counter()
            action()
            into.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples[0]), statistics.median(samples[1])


def posix_spawn_true() -> None:
    pid = os.posix_spawn(TRUE, [TRUE], {})
    os.waitpid(pid, 0)


@attrs.frozen
class CallFigures:
    """Medians in ms of a call and of ``posix_spawn_true``, each after a pause and back to back."""

    call_paused: float
    spawn_paused: float
    call_back_to_back: float
    spawn_back_to_back: float


def call_figures(
    call: Callable[[], object], runs: int, warm_up: int = 5, burst: int = 4
) -> CallFigures:
    """Sample ``call`` and ``posix_spawn_true`` each after a pause and back to back.

    One round: a pause, the call; a pause, a spawn; ``burst`` spawns in a row;
    ``burst`` calls in a row. The first of a row is not back to back and is not
    counted. Rounds alternate the four, so each sees the same machine: on a
    shared host the load changes within seconds, and phases measured apart
    would each catch a different one. The first ``warm_up`` rounds are dropped.
    """
    samples: dict[str, list[float]] = {f.name: [] for f in attrs.fields(CallFigures)}

    def timed(action: Callable[[], object]) -> float:
        began = time.perf_counter()
        action()
        return (time.perf_counter() - began) * 1000

    for index in range(warm_up + runs):
        time.sleep(PAUSE)
        paused_call = timed(call)
        time.sleep(PAUSE)
        paused_spawn = timed(posix_spawn_true)
        spawns = [timed(posix_spawn_true) for _ in range(burst)][1:]
        calls = [timed(call) for _ in range(burst)][1:]
        if index >= warm_up:
            samples["call_paused"].append(paused_call)
            samples["spawn_paused"].append(paused_spawn)
            samples["spawn_back_to_back"] += spawns
            samples["call_back_to_back"] += calls
    return CallFigures(**{name: statistics.median(values) for name, values in samples.items()})


def backend_of(name: str) -> Sandbox:
    if name == "docker":
        from astralvessel.sandbox.docker import Docker

        return Docker(base_image=IMAGE, pull=False)
    return get_backend(name)


def one_shot_argv(backend: Sandbox, command: list[str]) -> tuple[list[str], tuple[int, ...]]:
    """The command line of a one-shot sandbox of ``backend`` running ``command``.

    With the descriptors it must inherit: nsjail reads its mounts from a file the
    backend hands it (opened again by path on every run, so one serves them all).
    """
    if isinstance(backend, NamespaceBackend):
        facts, binary = backend._discover()
        assert binary is not None
        config = backend._config(Policy(), facts)
        fds = () if config is None else (_memfd(config, "astralvessel-bench-config"),)
        config_fd = fds[0] if fds else None
        return backend._argv(binary, Policy(), facts, command, None, config_fd=config_fd), fds
    return ["docker", "run", "--rm", "-i", "--network", "none", IMAGE, *command], ()


def executor(backend: Sandbox, warm: int = 0) -> Executor:
    return Executor(Registry(TOOLS), sandbox=backend, warm=warm)


# -- memory ------------------------------------------------------------------------------


def descendants(root: int) -> Iterator[int]:
    """``root`` and every process below it, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    todo = [root]
    while todo:
        pid = todo.pop()
        yield pid
        todo += children.get(pid, [])


def rollup_kib(pid: int) -> dict[str, int]:
    """``pid``'s ``/proc/PID/smaps_rollup`` in KiB by field (empty if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines()[1:]:
        name, _, value = line.partition(":")
        fields[name] = int(value.split()[0])
    return fields


def tree_kib(root: int, field: str) -> int:
    """The sum of ``field`` (``Pss`` or ``Rss``) of ``root``'s process tree, in KiB."""
    return sum(rollup_kib(pid).get(field, 0) for pid in descendants(root))


#: An idle turn's processes by how far below the server each is; above it, the binary's.
ROLES = {0: "server", 1: "zygote", 2: "spare"}


def role_kib(root: int) -> dict[str, tuple[int, int]]:
    """PSS and its anonymous part (``Pss_Anon``) in KiB of each role in ``root``'s tree.

    The server is the topmost Python process; the sandbox binary's own
    processes (bwrap's two; the ``unshare`` nsjail runs under, or nsjail in its
    once mode) are above it. A file worker, when alive, is counted with the
    zygote (both are the server's children).
    """
    depth: dict[int, int] = {}
    server_depth = None
    found: dict[str, tuple[int, int]] = {}
    for pid in descendants(root):  # each parent before its children
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            python = Path(f"/proc/{pid}/comm").read_text().startswith("python")
        except OSError:
            continue
        depth[pid] = depth[parent] + 1 if pid != root and parent in depth else 0
        if server_depth is None and python:
            server_depth = depth[pid]
        below = None if server_depth is None else depth[pid] - server_depth
        role = "binary" if below is None else ROLES.get(below, "other")
        fields = rollup_kib(pid)
        pss, anon = found.get(role, (0, 0))
        found[role] = (pss + fields.get("Pss", 0), anon + fields.get("Pss_Anon", 0))
    return found


def mean_roles_mib(roots: list[int]) -> dict[str, tuple[float, float]]:
    """``role_kib`` of each tree, averaged over the trees, in MiB."""
    trees = [role_kib(root) for root in roots]
    means = {}
    for name in ("binary", *ROLES.values(), "other"):
        if any(name in tree for tree in trees):
            pss = statistics.mean(tree.get(name, (0, 0))[0] for tree in trees) / 1024
            anon = statistics.mean(tree.get(name, (0, 0))[1] for tree in trees) / 1024
            means[name] = (pss, anon)
    return means


def settled_mean_kib(roots: list[int], field: str, timeout: float = 60.0) -> float:
    """The trees' mean ``field`` once every turn is idle: two samples a second apart agree.

    A turn is idle only once its spare init has built its namespaces and walked
    its request path, which writes (copies) pages; on a loaded machine that
    takes longer than any fixed pause, and an earlier sample would count less.
    """
    deadline = time.monotonic() + timeout
    last = statistics.mean(tree_kib(r, field) for r in roots)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = statistics.mean(tree_kib(r, field) for r in roots)
        if abs(now - last) <= 0.005 * last:
            return now
        last = now
    return last


def session_root(session: SandboxSession) -> int | None:
    if isinstance(session, ServerSession) and isinstance(session.channel, PipeChannel):
        return session.channel.process.pid
    return None


def serve(session: SandboxSession, rounds: int = 3) -> None:
    """A few tool calls and execs into ``session``: what ``Turn.call`` and ``Turn.exec`` send."""
    for _ in range(rounds):
        for argv in ((TRUE,), PY):
            outcome = session.run(RunRequest(argv=argv, timeout=60, output_chars=1000))
            assert outcome.exit_code == 0, outcome.output
            result = session.exec(ExecRequest(argv=argv, timeout=60, output_bytes=1000))
            assert result.returncode == 0, result.stderr


@attrs.frozen
class IdleMemory:
    """MiB per idle turn: fresh (PSS, RSS), after calls (PSS, RSS), and a bare interpreter's PSS.

    With the PSS per role and its anonymous part, fresh and after calls (``mean_roles_mib``).
    """

    fresh: tuple[float, float]
    served: tuple[float, float]
    bare: float
    fresh_roles: dict[str, tuple[float, float]]
    served_roles: dict[str, tuple[float, float]]


def idle_memory(backend: Sandbox, turns: int) -> IdleMemory | None:
    """The same ``turns`` turns measured idle when fresh, then again after they served calls."""
    if not isinstance(backend, NamespaceBackend):
        return None
    facts, _ = backend._discover()
    argv, fds = one_shot_argv(backend, [facts.python.executable, "-I", "-S", "-c", "input()"])
    bare = subprocess.Popen(
        argv,
        pass_fds=fds,
        stdin=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # killed at the end: whatever it says then is noise
        start_new_session=True,
    )
    sessions = [backend.start(Policy()) for _ in range(turns)]
    try:
        roots = [r for r in map(session_root, sessions) if r is not None]

        def measure() -> tuple[float, float]:
            pss = settled_mean_kib(roots, "Pss") / 1024
            return pss, statistics.mean(tree_kib(r, "Rss") for r in roots) / 1024

        fresh = measure()
        fresh_roles = mean_roles_mib(roots)
        for session in sessions:
            serve(session)
        served = measure()
        served_roles = mean_roles_mib(roots)
        bare_pss = tree_kib(bare.pid, "Pss") / 1024
    finally:
        for session in sessions:
            session.close()
        bare.kill()
        bare.wait()
    return IdleMemory(
        fresh=fresh,
        served=served,
        bare=bare_pss,
        fresh_roles=fresh_roles,
        served_roles=served_roles,
    )


# -- many turns at once ------------------------------------------------------------------


def many_turns(backend: Sandbox, turns: int, calls: int) -> tuple[int, float, float, float]:
    """Errors, p50 and p95 of a call in ms, and the wall time in s of ``turns`` turns at once."""
    ex = executor(backend)
    durations: list[float] = []
    errors = 0
    gate = concurrent.futures.ThreadPoolExecutor(turns)

    def one(_: int) -> tuple[int, list[float]]:
        bad, took = 0, []
        try:
            with ex.turn() as turn:
                for _ in range(calls):
                    began = time.perf_counter()
                    result = turn.call("py", {})
                    took.append((time.perf_counter() - began) * 1000)
                    bad += result.is_error or result.text.strip() != "49995000"
        except Exception:
            bad += calls
        return bad, took

    began = time.perf_counter()
    with gate:
        for bad, took in gate.map(one, range(turns)):
            errors += bad
            durations += took
    wall = time.perf_counter() - began
    if not durations:
        return errors, float("nan"), float("nan"), wall
    durations.sort()
    return errors, durations[len(durations) // 2], durations[int(len(durations) * 0.95)], wall


# -- the table ---------------------------------------------------------------------------


def row(figure: str, value: str, baseline: str, ratio: str, target: str, **verdict: bool) -> None:
    """One line of the table; ``holds=`` says whether the target holds."""
    holds = verdict.get("holds")
    mark = "" if holds is None else ("ok" if holds else "MISSED")
    print(f"  {figure:<34} {value:>12} {baseline:>28} {ratio:>8}  {target:<22} {mark}")


def cold_start_rows(
    name: str, backend: Sandbox, run_one_shot: Callable[[], None], runs: int
) -> float:
    """Print the cold start rows; return the one-shot baseline's median (ms) they used."""
    base_name = "docker run --rm" if name == "docker" else f"one-shot {name}"
    backend.start(Policy()).close()  # the image's checks, once per process, are not a turn's
    one_shot_ms, cold_ms = paired_medians(
        run_one_shot, lambda: backend.start(Policy()).close(), runs
    )
    ratio = cold_ms / one_shot_ms
    if name == "docker":
        row(
            "cold start + close",
            f"{cold_ms:.1f} ms",
            f"{base_name} {one_shot_ms:.1f} ms",
            f"{ratio:.2f}x",
            "<= 1.1x docker run",
            holds=ratio <= 1.1,
        )
    else:
        row(
            "cold start + close",
            f"{cold_ms:.1f} ms",
            f"{base_name} {one_shot_ms:.1f} ms",
            f"{ratio:.1f}x",
            "<= 60 ms",
            holds=cold_ms <= 60,
        )

    # A turn that serves a call pays for what the start leaves for later (the spare's zygote
    # and chain are built after ready, and killed at the close): shown beside the target row.
    request = RunRequest(argv=[TRUE], timeout=30, output_chars=1000)

    def start_call_close() -> None:
        session = backend.start(Policy())
        try:
            session.run(request)
        finally:
            session.close()

    one_shot_used_ms, used_ms = paired_medians(run_one_shot, start_call_close, runs)
    row(
        "  cold start + call + close",
        f"{used_ms:.1f} ms",
        f"{base_name} {one_shot_used_ms:.1f} ms",
        f"{used_ms / one_shot_used_ms:.2f}x",
        "(no target)",
    )
    return one_shot_ms


def bench(name: str, runs: int, turns: int, idle: int) -> None:
    backend = backend_of(name)
    engine = getattr(backend, "engine", None)
    # Docker's figures depend on how many runc requests the host sends at once.
    print(name if engine is None else f"{name} (engine_concurrency {engine.concurrency})")
    row("figure", "measured", "baseline", "ratio", "target")
    one_shot, fds = one_shot_argv(backend, [TRUE])

    def run_one_shot() -> None:
        subprocess.run(one_shot, check=True, stdin=subprocess.DEVNULL, pass_fds=fds)

    base_name = "docker run --rm" if name == "docker" else f"one-shot {name}"

    with executor(backend) as ex, ex.turn() as turn:
        calls = call_figures(lambda: turn.call("true"), runs * 10)
    ratio = calls.call_paused / calls.spawn_paused
    row(
        "call after a pause",
        f"{calls.call_paused:.2f} ms",
        f"posix_spawn, same pause {calls.spawn_paused:.2f} ms",
        f"{ratio:.1f}x",
        "<= 4x",
        holds=ratio <= 4,
    )
    row(
        "  (vs posix_spawn back to back)",
        "",
        f"posix_spawn {calls.spawn_back_to_back:.2f} ms",
        f"{calls.call_paused / calls.spawn_back_to_back:.1f}x",
        "",
    )
    row(
        "call back to back",
        f"{calls.call_back_to_back:.2f} ms",
        f"posix_spawn {calls.spawn_back_to_back:.2f} ms",
        f"{calls.call_back_to_back / calls.spawn_back_to_back:.1f}x",
        "(no target)",
    )

    one_shot_ms = cold_start_rows(name, backend, run_one_shot, runs)

    with executor(backend, warm=1) as ex:
        samples = []
        for _ in range(runs):
            assert ex.wait_warm(120)
            began = time.perf_counter()
            with ex.turn() as turn:
                result = turn.call("true")
                samples.append((time.perf_counter() - began) * 1000)
            assert not result.is_error, result.text
    warm_ms = statistics.median(samples)
    ratio = warm_ms / one_shot_ms
    row(
        "warm start + call",
        f"{warm_ms:.1f} ms",
        f"{base_name} {one_shot_ms:.1f} ms",
        f"{ratio:.2f}x",
        "<= 2x",
        holds=ratio <= 2,
    )

    errors, p50, p95, wall = many_turns(backend, turns, calls=3)
    row(
        f"{turns} turns at once",
        f"{errors} errors",
        f"call p50 {p50:.0f} ms p95 {p95:.0f}",
        f"{wall:.1f} s",
        "0 errors",
        holds=errors == 0,
    )

    memory = idle_memory(backend, idle)
    if memory is None:
        row("memory per idle turn", "n/a", "(not a host process tree)", "", "<= 8 MiB")
    else:
        for figure, (pss, rss), roles in (
            ("memory per idle turn", memory.fresh, memory.fresh_roles),
            ("memory per idle turn after calls", memory.served, memory.served_roles),
        ):
            row(
                figure,
                f"{pss:.1f} MiB",
                f"bare python {memory.bare:.1f} MiB PSS",
                f"{pss / memory.bare:.1f}x",
                "<= 8 MiB (PSS)",
                holds=pss <= 8,
            )
            row("  (RSS, shared counted)", f"{rss:.1f} MiB", "", "", "")
            parts = "  ".join(f"{name} {p:.2f} ({a:.2f})" for name, (p, a) in roles.items())
            print(f"    PSS per process, MiB (anonymous part): {parts}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backends", nargs="*", default=["bubblewrap", "nsjail", "docker"])
    parser.add_argument("--runs", type=int, default=9, help="samples per median")
    parser.add_argument("--turns", type=int, default=128, help="turns at once")
    parser.add_argument("--idle", type=int, default=8, help="idle turns measured for memory")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; medians of {args.runs} runs\n")
    for name in args.backends:
        bench(name, args.runs, args.turns, args.idle)


if __name__ == "__main__":
    main()
