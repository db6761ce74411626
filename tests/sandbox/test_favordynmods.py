"""doctor's favordynmods hint, decided from /proc/self/mounts' text through the host facts."""

from __future__ import annotations

from astralvessel.sandbox._hostinfo import (
    HostFacts,
    PythonRuntime,
    cgroup_mounts,
    favordynmods_hint,
)

ROOT = "/dev/sda1 / ext4 rw,relatime 0 0"
V1_MEMORY = "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0"
V1_PIDS = "cgroup /sys/fs/cgroup/pids cgroup rw,nosuid,nodev,noexec,relatime,pids 0 0"
V2 = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0"
V2_FAVORED = "cgroup2 /sys/fs/cgroup cgroup2 rw,relatime,favordynmods 0 0"
V1_NAMED_FAVORED = "cgroup /run/fdm cgroup rw,relatime,favordynmods,name=fdm 0 0"


def _hint(lines: list[str]) -> str | None:
    v1, v2, favored = cgroup_mounts("\n".join(lines))
    facts = HostFacts(
        uid=0,
        machine="x86_64",
        userns=True,
        python=PythonRuntime(executable="/usr/bin/python3", prefix="/usr"),
        cgroup_v1=v1,
        cgroup_v2=v2,
        cgroup_favordynmods=favored,
    )
    return favordynmods_hint(facts)


def test_cgroup_v1_without_the_option_gets_the_hint() -> None:
    """cgroup v1 mounted, no hierarchy (v1 or v2) with favordynmods: one hint naming the option."""
    for lines in ([ROOT, V1_MEMORY, V1_PIDS, V2], [V1_MEMORY]):
        hint = _hint(lines)
        assert hint is not None
        assert "favordynmods" in hint
        assert "/sys/fs/cgroup/memory" in hint


def test_no_hint_where_a_hierarchy_has_it_or_there_is_no_v1() -> None:
    """The lock it changes is one for the whole kernel: any hierarchy with the option is enough,
    and a host with cgroup v2 alone (or no cgroup, or unreadable text) gets no hint."""
    for lines in (
        [ROOT, V1_MEMORY, V1_PIDS, V1_NAMED_FAVORED],
        [ROOT, V1_MEMORY, V2_FAVORED],
        [ROOT, V2],
        [ROOT],
        [],
        ["garbage cgroup", "1 2 3"],
    ):
        assert _hint(lines) is None, lines
