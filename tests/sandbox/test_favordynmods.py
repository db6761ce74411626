"""doctor's favordynmods hint, decided from /proc/self/mountinfo's text alone."""

from __future__ import annotations

from astralvessel.sandbox._favordynmods import favordynmods_hint

ROOT = "29 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw"
V1_MEMORY = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
V1_PIDS = "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids"
V2 = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw"
V2_FAVORED = "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw,favordynmods"
V1_NAMED_FAVORED = "46 27 0:40 / /run/fdm rw,relatime - cgroup cgroup rw,favordynmods,name=fdm"


def test_cgroup_v1_without_the_option_gets_the_hint() -> None:
    """cgroup v1 mounted, no hierarchy (v1 or v2) with favordynmods: one hint naming the option."""
    for lines in ([ROOT, V1_MEMORY, V1_PIDS, V2], [V1_MEMORY]):
        hint = favordynmods_hint("\n".join(lines))
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
        ["garbage - cgroup", "1 2 3 4 /x - cgroup"],
    ):
        assert favordynmods_hint("\n".join(lines)) is None, lines
