"""The ``astralvessel`` command line: check, tools, call, doctor, fetch, search, mcp, ledger.

Exit codes are a contract: 0 success; 1 the tool call's result is an error;
2 the host's error (bad agent folder, backend unavailable, bad flags), with one
clear line on stderr (``check`` lists each problem of the agent folder on a line
of its own); 130 interrupted (Ctrl-C), with one line. Set ``ASTRALVESSEL_DEBUG=1``
to see the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, NoReturn

from ._edges._cli_options import add_network_option, add_relax_option, executor_from
from ._edges._cli_progress import progress
from ._edges._terminal import for_terminal
from .errors import AstralVesselError, ConfigError

if TYPE_CHECKING:
    from .sandbox._base import BackendReport

__all__ = ["main"]

EXIT_OK, EXIT_TOOL_ERROR, EXIT_HOST_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked (metadata costs 0.1 s)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from . import __version__

        print(f"astralvessel {__version__}")
        parser.exit(EXIT_OK)


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line, as the CLI contract says."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_HOST_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser (exposed for the docs and tests)."""
    parser = _Parser(prog="astralvessel", description="Run an LLM agent's tool calls in a sandbox.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    check = sub.add_parser("check", help="check an agent folder; exit 2 listing every problem")
    check.add_argument("agent_dir")
    check.set_defaults(handler=_check)

    tools = sub.add_parser("tools", help="print the agent's tool schemas as JSON")
    tools.add_argument("agent_dir")
    tools.add_argument(
        "--dialect", default="openai", choices=["openai", "openai-responses", "anthropic", "mcp"]
    )
    tools.add_argument("--scope", action="append", dest="scopes", metavar="S")
    tools.set_defaults(handler=_tools)

    call = sub.add_parser("call", help="run one tool call in a sandbox and print the result")
    call.add_argument("agent_dir")
    call.add_argument("tool")
    call.add_argument(
        "arguments", nargs="?", default="{}", help="the JSON arguments, or - for stdin"
    )
    call.add_argument("--mount", action="append", default=[], metavar="SANDBOX_PATH=HOST_PATH[:rw]")
    call.add_argument(
        "--backend", default=None, help="bubblewrap, nsjail, docker, docker-exec, unconfined, ..."
    )
    call.add_argument("--scope", action="append", dest="scopes", metavar="S")
    add_relax_option(call)
    add_network_option(call)
    call.add_argument("--json", action="store_true", help="print the whole result as JSON")
    call.add_argument(
        "--outbox",
        default=None,
        metavar="DIR",
        help="write the call's outbox files under DIR (default: a new temporary folder, "
        "kept only if the call left files)",
    )
    call.set_defaults(handler=_call)

    doctor = sub.add_parser("doctor", help="say which backends can run here and what they enforce")
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(handler=_doctor)

    for module in ("._edges._cli_web", "._edges._cli_mcp", "._edges._cli_ledger"):
        try:
            importlib.import_module(module, __package__).register(sub)
        except ModuleNotFoundError as exc:  # an optional part that is not built in
            if exc.name != f"{__package__}.{module[1:]}":
                raise
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    try:
        args = build_parser().parse_args(argv)
        code: int = args.handler(args)
    except KeyboardInterrupt:
        print("astralvessel: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_HOST_ERROR
    except BrokenPipeError:
        _silence_stdout()  # the reader went away (``| head``): nothing left to say
        return EXIT_HOST_ERROR
    except Exception as exc:
        if os.environ.get("ASTRALVESSEL_DEBUG"):
            raise
        print(f"astralvessel: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_HOST_ERROR
    return code


def one_line(exc: BaseException) -> str:
    """An error as one line: the library's own errors say what to do; others say what they are."""
    text = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if not isinstance(exc, (AstralVesselError, ValueError, OSError)):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text[:2000]


def _silence_stdout() -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def _check(args: argparse.Namespace) -> int:
    from .agent import Agent

    agent = Agent.load(args.agent_dir)
    print(f"{agent.name}: ok ({len(agent.builtin)} built-in, {len(agent.tools)} declared tools)")
    return EXIT_OK


def _tools(args: argparse.Namespace) -> int:
    from .agent import Agent
    from .registry import Registry

    registry = Registry.for_agent(Agent.load(args.agent_dir))
    json.dump(registry.schemas(args.dialect, scopes=args.scopes), sys.stdout, indent=2)
    print()
    return EXIT_OK


def unmounted_workdir(workdir: PurePosixPath, targets: list[PurePosixPath]) -> str | None:
    """Why the agent's tools would see an empty workdir, or None when a mount or the workspace
    serves it: without this line the answer to a forgotten --mount is a silent empty list."""
    from .sandbox._policy import WORKSPACE_DIR

    if workdir == WORKSPACE_DIR or WORKSPACE_DIR in workdir.parents:
        return None
    if any(t == workdir or t in workdir.parents for t in targets):
        return None
    return (
        f"the agent's workdir {workdir} has no mount, so its tools see an empty folder there; "
        f"give one with --mount {workdir}=HOST_PATH"
    )


def _call(args: argparse.Namespace) -> int:
    from .agent import Agent
    from .sandbox._policy import Mount

    agent = Agent.load(args.agent_dir)
    mounts = [Mount.parse(text) for text in args.mount]
    warning = unmounted_workdir(agent.workdir, [m.target for m in mounts])
    if warning is not None:
        print(f"astralvessel: warning: {warning}", file=sys.stderr)
    arguments = sys.stdin.read() if args.arguments == "-" else args.arguments
    # The files a result names must exist after the CLI exits: they go to --outbox, or to
    # a temporary folder that is kept (and named on stderr) only if the call left files.
    outbox = args.outbox or tempfile.mkdtemp(prefix="astralvessel-outbox-")
    executor = executor_from(args, agent, mounts, outbox_dir=outbox)
    try:
        with executor.turn() as turn, progress(args.tool):
            result = turn.call(args.tool, arguments)
    finally:
        if args.outbox is None and not _holds_files(outbox):
            shutil.rmtree(outbox, ignore_errors=True)
    if result.files and args.outbox is None:
        print(f"astralvessel: outbox files kept in {outbox}", file=sys.stderr)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2, ensure_ascii=False)
        print()
    else:
        # The text is untrusted and this is often a terminal (and a pipe often ends
        # in one): its control sequences are shown, not obeyed. --json is exact.
        text = for_terminal(result.text)
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_TOOL_ERROR if result.is_error else EXIT_OK


def _holds_files(folder: str) -> bool:
    return any(path.is_file() for path in Path(folder).rglob("*"))


def _doctor(args: argparse.Namespace) -> int:
    from ._executor._snapshot._mechanism import snapshot_mechanism
    from .sandbox._discovery import all_backends
    from .sandbox._hostinfo import (
        collect_host_facts,
        favordynmods_hint,
        shared_counters_hint,
        tcp_buffers_hint,
    )
    from .sandbox._policy import EVAL_RELAXATIONS

    reports = [backend.probe() for backend in all_backends()]
    if args.json:
        json.dump([_report_json(r) for r in reports], sys.stdout, indent=2)
        print()
        return EXIT_OK
    for report in reports:
        state = "can run" if report.available else "cannot run"
        print(f"{report.name}: {state}{f' ({report.reason})' if report.reason else ''}")
        if report.binary and "binary" not in report.details:
            print(f"  binary: {report.binary}")
        for key, value in sorted(report.details.items()):
            print(f"  {key}: {value}")
        for limit, mechanism in report.mechanisms.items():
            print(f"  limit {limit}: {mechanism}")
        print(f"  snapshots: {snapshot_mechanism(report.name)}")
        for promise in sorted(report.enforced, key=lambda p: p.value):
            print(f"  enforces   {promise.value}: {promise.summary}")
        for promise, why in sorted(report.unenforced.items(), key=lambda kv: kv[0].value):
            print(f"  NOT KEPT   {promise.value}: {why}")
    facts = collect_host_facts()
    for hint in (favordynmods_hint(facts), tcp_buffers_hint(facts), shared_counters_hint(facts)):
        if hint is not None:
            print(f"hint: {hint}")
    print(
        "opt-in eval relaxations (Executor(NAME=True), --writable-root, --root-identity, "
        "--tool-servers, [sandbox] NAME; they change policy_id; not on docker-exec or unconfined):"
    )
    for name, gives_up in EVAL_RELAXATIONS.items():
        print(f"  {name} gives up {gives_up}")
    return EXIT_OK


def _report_json(report: BackendReport) -> dict[str, object]:
    from ._executor._snapshot._mechanism import snapshot_mechanism

    return {
        "name": report.name,
        "available": report.available,
        "reason": report.reason,
        "binary": report.binary,
        "enforced": sorted(p.value for p in report.enforced),
        "unenforced": {p.value: why for p, why in report.unenforced.items()},
        "details": dict(report.details),
        "mechanisms": dict(report.mechanisms),
        "snapshots": snapshot_mechanism(report.name),
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
