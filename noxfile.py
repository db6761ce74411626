"""Development sessions: ``nox -s tests``, ``unprivileged``, ``lint``, ``typing``, ``docs``,
``bench``; plain ``nox`` runs ``ci``, which runs the first five in two streams at once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import nox

nox.options.sessions = ["ci"]
nox.options.reuse_existing_virtualenvs = True
# uv where nox was installed with it (``pip install 'nox[uv]'``, as .ci/run does), else venv and
# pip: pip took 430 s to fill a test venv at load 16 where uv took 36 s, the same versions.
nox.options.default_venv_backend = "uv|venv"

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
TEST_DEPS = [
    # Ray has wheels for 3.10-3.13 (2.60 checked), so the two-node Ray test runs on each.
    # inspect_ai's provider and its self-check (inspect_ai installs on 3.11 and later only).
    ".[all,ray,inspect]",
    "pytest>=8",
    "pytest-asyncio>=0.23",
    "pytest-timeout>=2.3",
    "cryptography>=42",
    "html2text>=2024.2.26",
    "urllib3>=2",
    # The vendors' SDKs, only so their own types can check the shapes we produce.
    "openai>=1.99",
    "anthropic>=0.60",
    "hypothesis>=6.100",
    # A trio host awaits calls in the tests, as an asyncio host does.
    "trio>=0.25",
    # Deep Agents' own sandbox conformance suite, run against VesselSandbox (3.11 and later).
    "langchain-tests>=1.1.9; python_version >= '3.11'",
    # The span tests read spans from the SDK's in-memory exporter (the otel extra is the API).
    "opentelemetry-api>=1.20",
    "opentelemetry-sdk>=1.20",
]


#: The Python that runs every backend; the others run the suite on bubblewrap alone, which
#: keeps CI near half its time without losing a Python-version check of any module.
FULL_MATRIX_PYTHON = "3.11"


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run the tests with real sandboxes: every backend on one Python, bubblewrap on the rest."""
    session.install(*TEST_DEPS)
    args = list(session.posargs)
    if not args and session.python != FULL_MATRIX_PYTHON:
        # The scale tests (128 turns at once) check capacity, not the Python version; the slow
        # ones spend their time waiting, on volume or on a second variant of a path the rest
        # of the suite runs here too (the markers' texts in pyproject.toml say so).
        args = ["-k", "not nsjail and not docker", "-m", "not scale and not slow"]
    # One pytest, serially: two pytest-xdist workers on this 2-core machine kind made the
    # full-matrix session longer, not shorter (3.11: 10.5 min for the bubblewrap and nsjail
    # part on two workers, 20 for Docker's serially after, against 28 for all of it
    # serially before); a sandbox's start and calls keep both cores busy themselves.
    session.run("pytest", *args)


#: What ``ci`` runs: each stream is one nox run of these sessions in turn, the streams at once.
#: The tests wait on sandboxes far more than they compute (a serial run keeps this 2-core
#: machine kind's load near 1), so two at once take little longer each than alone: in the
#: first run of these streams the ordinary user's session and each other Python's took 6.5-7
#: min and 3.11's 27.5, and the whole 30 min, against 58 min in a row the stop before. The
#: ordinary user's copy of the tree is made first, before the other stream's tests write into
#: the checkout.
CI_STREAMS = (
    ("unprivileged", *(f"tests-{p}" for p in PYTHONS if p != FULL_MATRIX_PYTHON)),
    ("lint", f"tests-{FULL_MATRIX_PYTHON}", "typing", "docs"),
)


@nox.session(python=False)
def ci(session: nox.Session) -> None:
    """Every session but ``bench``, in the streams of ``CI_STREAMS`` at once; each output line is
    printed as it comes, behind its session's name. Fails if any session failed, after all ran."""
    lock = threading.Lock()
    failed: list[str] = []

    def run(stream: tuple[str, ...]) -> None:
        # nox itself runs a stream's sessions in turn and goes on past a failed one.
        child = subprocess.Popen(
            [sys.executable, "-m", "nox", "--sessions", *stream],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        current = stream[0]
        for line in child.stdout or ():
            # nox announces each session with "nox > Running session NAME".
            if "Running session " in line:
                current = line.rsplit("Running session ", 1)[1].strip()
            with lock:
                print(f"[{current}] {line}", end="", flush=True)
        if child.wait() != 0:
            with lock:
                failed.append(" ".join(stream))

    threads = [threading.Thread(target=run, args=(stream,)) for stream in CI_STREAMS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        session.error(f"a session failed in: {'; '.join(failed)} (its lines are marked above)")


#: The ordinary user .ci/setup.sh creates; as root, ``unprivileged`` runs everything as it.
CI_USER = "vesselci"
#: The interpreter the ordinary user's venv is made from: the system's (root's pyenv is private).
SYSTEM_PYTHON = "/usr/bin/python3"


def _readme_quick_start() -> str:
    """The README's one-line quick start, exactly as a reader would paste it."""
    text = Path("README.md").read_text(encoding="utf-8")
    match = re.search(r"^pip install '\.\[bubblewrap\]' && astralvessel call .*$", text, re.M)
    if match is None:
        raise RuntimeError(
            "README.md has no `pip install '.[bubblewrap]' && astralvessel call` line"
        )
    return match.group(0)


@nox.session(python=False)
def unprivileged(session: nox.Session) -> None:
    """As an ordinary user, no relax: the README's quick start, the conformance suite, the field
    tests, inspect's; the snapshot and fork conformance on Docker, as a docker group member."""
    root = os.geteuid() == 0
    # The checkout may sit where the user cannot read (CI clones under /root): work on a copy
    # the user owns, in a venv of the system's Python.
    work = Path(tempfile.mkdtemp(prefix="astralvessel-unprivileged-"))
    tree = work / "astralvessel"
    shutil.copytree(
        ".",
        tree,
        ignore=shutil.ignore_patterns(
            ".git",
            ".nox",
            ".venv",
            "_build",
            ".*_cache",
            ".hypothesis",
            "__pycache__",
            "*.egg-info",
        ),
    )
    # uv fills the test venv in a fraction of pip's time; the user gets a copy, since it
    # cannot run root's (under pyenv's private folder).
    uv = _uv_copy_in(work)
    prefix: list[str] = []
    if root:
        home = f"/home/{CI_USER}"
        session.run("chown", "-R", f"{CI_USER}:", str(work), external=True)
        prefix = ["runuser", "-u", CI_USER, "--", "env", f"HOME={home}"]
    session.chdir(str(tree))
    try:
        venv = work / "venv"
        session.run(*prefix, SYSTEM_PYTHON, "-m", "venv", str(venv), external=True)
        # The quick start exactly as the README has it, in that venv.
        command = f". {venv}/bin/activate && {_readme_quick_start()}"
        session.run(*prefix, "bash", "-c", command, external=True)
        installer = (
            [str(uv), "pip", "install", "--python", f"{venv}/bin/python"]
            if uv is not None
            else [f"{venv}/bin/pip", "install"]
        )
        session.run(
            *prefix,
            *installer,
            "-q",
            # The system Python is 3.11 (Debian 12), which inspect_ai supports.
            ".[bubblewrap,nsjail,docker,inspect,deepagents,openai-agents]",
            "langchain-tests>=1.1.9",
            # The allow-listed network's conformance tests make their own TLS certificate.
            "cryptography>=42",
            "pytest>=8",
            "pytest-asyncio>=0.23",
            "pytest-timeout>=2.3",
            # The snapshot tests' generated names and trees.
            "hypothesis>=6.100",
            external=True,
        )
        # A snapshot's saved form as the user who loads it: modes, unreadable files, no root.
        session.run(
            *prefix,
            f"{venv}/bin/python",
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "tests/snapshot",
            # Trees with folders of mode 0555, which only an ordinary user's removal trips on.
            "tests/core/test_snapshot_budget.py",
            "tests/sandbox/test_leftovers.py",
            # The reaper's removal as an ordinary user (links never followed, busy folders),
            # and the listing's depth bound, whose descriptors count against its own limit.
            "tests/core/test_snapshot_reaper.py",
            "tests/sandbox/test_snapfiles_depth.py",
            # The freeze in a user namespace of the sandbox's own, and the host's take of the
            # clone as that namespace's owner (pidfd_getfd).
            "tests/sandbox/test_freeze.py",
            "tests/sandbox/test_freeze_steps.py",
            external=True,
        )
        session.run(
            *prefix,
            f"{venv}/bin/python",
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "tests/conformance",
            "tests/sandbox/test_lifetime.py",
            # Field conditions at once: exiting threads, closes mid-call, many turns, hostile input.
            "tests/fuzz/test_field.py",
            # The inspect provider as an ordinary user: inspect's self-check and real evals.
            "tests/inspect",
            # The frameworks' sandbox interfaces, their ids naming the backend.
            "tests/integrations/test_deepagents_suite.py",
            "tests/integrations/test_openai_sandbox.py",
            "-k",
            "bubblewrap or nsjail",
            *session.posargs,
            external=True,
        )
        # Snapshots and forks on Docker as a user of the docker group (.ci/setup.sh), not root:
        # the turn's files belong to the leased uid, which the host must read and restore.
        session.run(
            *prefix,
            f"{venv}/bin/python",
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "tests/conformance/test_snapshots.py",
            "tests/conformance/test_fork.py",
            "tests/conformance/test_fork_ahead.py",
            "tests/conformance/test_fork_adopt.py",
            "tests/conformance/test_snapshot_budget.py",
            "tests/conformance/test_snapshot_reuse.py",
            # A fork of a fork's own layer stacked over its parent's (the reader merges them).
            "tests/docker/test_frozen_stack_user.py",
            # Its frozen layers and stacks saved and copied to the store (the reader streams).
            "tests/docker/test_frozen_save_user.py",
            "-k",
            "docker",
            *session.posargs,
            external=True,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _uv_copy_in(folder: Path) -> Path | None:
    """A copy in ``folder`` of the uv nox runs with, or None where nox came without uv."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    copy = folder / "uv"
    shutil.copy2(find_uv_bin(), copy)
    return copy


def _install_uncompiled(session: nox.Session, *requirements: str) -> None:
    """Install without compiling every module to bytecode: uv never does, pip must be told."""
    if session.venv_backend == "uv":
        session.install(*requirements)
    else:
        session.install("--no-compile", *requirements)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typing(session: nox.Session) -> None:
    """mypy --strict on the package and on a file that only uses the public API."""
    # mypy reads the sources and never imports them: compiling them at install is wasted.
    _install_uncompiled(
        session,
        ".[all,inspect]",
        "mypy>=1.10",
        "pytest>=8",
        "types-docker",
        "types-jsonschema",
        "tomli",
    )
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the docs with warnings as errors."""
    # pytest too: the API reference imports astralvessel.testing's pytest plugin.
    # The build imports a small part of what it installs; that part is compiled as it is imported.
    _install_uncompiled(session, ".[all]", "pytest>=8", "sphinx>=7", "myst-parser>=3", "furo")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark; each prints ratios against a baseline measured in the same run."""
    # bench_extract.py measures webfetch's main content against these extractors.
    session.install(
        ".[all,ray]", "html2text>=2024.2.26", "trafilatura>=2.0", "readability-lxml>=0.8.4"
    )
    for script in sorted(__import__("pathlib").Path("bench").glob("bench_*.py")):
        session.run("python", str(script), *session.posargs)
