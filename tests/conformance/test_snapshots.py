"""``Turn.snapshot``, ``Executor.turn(snapshot=)`` and ``Turn.fork``: a turn's files as a value.

Each test runs on every backend through the suite's fixtures, as root and (the
``unprivileged`` session) as an ordinary user. The files a call makes are the
model's to shape, so several tests make hostile ones: each is kept faithfully or
refused with a ``SnapshotError`` naming it, and nothing of it reaches the host.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astralvessel import Executor, SnapshotError, Turn, TurnSnapshot, UsageError
from astralvessel._executor._snapshot._mechanism import overlay_backend
from astralvessel._executor._snapshot._reaper import drain
from astralvessel._executor._snapshot._tree import scan_tree
from astralvessel.sandbox import Limits, Sandbox

from .calls import run_script
from .conftest import suite_executor

#: Lists every name under the workspace (the server's outbox aside) with its kind, mode,
#: size, link target and link count, then each regular file's checksum: what a restore
#: must reproduce (owners are the turn's, and times are not kept). A folder's size and
#: link count are its filesystem's (a tmpfs, or an overlay's folders, which count one).
_LISTING = (
    "cd /workspace && find . -path ./outbox -prune -o -mindepth 1 "
    "\\( -type d -printf '%P|%y|%m\\n' -o -printf '%P|%y|%m|%s|%l|%n\\n' \\) "
    "| LC_ALL=C sort | od -c "
    "&& find . -path ./outbox -prune -o -type f -exec md5sum {} + | LC_ALL=C sort"
)
#: Folders, modes, a symlink in and one out, a hard link, an empty file, a name that is
#: not UTF-8, a sparse file and a folder without write bits.
_MAKE_TREE = (
    "cd /workspace && mkdir -p a/b c && echo hi > a/b/f && ln a/b/f a/hard && "
    "ln -s ../c a/in && ln -s /etc/passwd a/out && : > empty && "
    "printf x > \"$(printf 'n\\377me')\" && chmod 750 a && chmod 600 a/b/f && "
    "truncate -s 3M sparse && printf y >> sparse && chmod 555 c"
)


def test_a_turn_opened_from_a_snapshot_has_its_files(executor: Executor):
    """Folders, modes, links in and out, hard links, odd names and sparse files come back as they were."""
    with executor.turn() as turn:
        run_script(turn, _MAKE_TREE)
        before = run_script(turn, _LISTING)
        snapshot = turn.snapshot()
    with executor.turn(snapshot=snapshot) as restored:
        assert run_script(restored, _LISTING) == before
        assert run_script(restored, "id -u; stat -c %u /workspace/a/b/f | tr -d '\\n'; echo") == (
            run_script(restored, "id -u; id -u")
        )
    assert snapshot.file_count == 10
    assert snapshot.total_bytes == 3 + 1 + 3 * 2**20 + 1


def test_a_links_target_stays_in_the_sandbox(executor: Executor):
    """A link pointing out of the workspace is kept as a link: the host never follows it."""
    with executor.turn() as turn:
        run_script(turn, "ln -s /etc/shadow /workspace/out && ln -s ../../../../.. /workspace/up")
        snapshot = turn.snapshot()
    assert os.readlink(snapshot.path / "out") == "/etc/shadow"
    assert os.readlink(snapshot.path / "up") == "../../../../.."
    assert sorted(os.listdir(snapshot.path)) == ["out", "up"]


def test_a_forks_writes_reach_neither_its_siblings_nor_its_parent(executor: Executor):
    """Each fork writes its own files; its siblings and the parent still see the snapshot's."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        forks = parent.fork(3)
        run_script(parent, "echo parent > /workspace/f")
        try:
            for index, fork in enumerate(forks):
                assert run_script(fork, "cat /workspace/f") == "base\n"
                run_script(fork, f"echo fork{index} > /workspace/f && touch /workspace/only{index}")
            for index, fork in enumerate(forks):
                seen = run_script(fork, "cat /workspace/f; ls /workspace")
                assert seen == f"fork{index}\nf\nonly{index}\noutbox\n"
            assert run_script(parent, "cat /workspace/f; ls /workspace") == "parent\nf\noutbox\n"
        finally:
            for fork in forks:
                fork.close()


#: What a fork tries on the files it was opened with: write, chmod, unlink, rename, hard
#: links, a set-id file, and the bound tree below the overlay itself.
_TAMPER = (
    "cd /workspace && echo changed >> kept && chmod 777 kept && rm gone && mv moved away && "
    "ln kept kept.hard && ln deep/inner deep/inner.hard && echo x >> deep/inner && "
    "cp kept setid && rmdir empty && mkdir empty2 && chmod 700 deep && rm -r tree && "
    "{ chmod 6755 setid kept; chmod u+s deep/inner; "
    "echo bad > /.vessel-lower/kept; mkdir /.vessel-lower/x; "
    "umount /workspace; umount -l /workspace; true; } 2>/dev/null"
)


def _layer_state(executor: Executor, snapshot: TurnSnapshot, bounds: dict[str, int]) -> object:
    """The content id of the snapshot's tree as the host scans it; where the host cannot
    read it (an ordinary user's Docker frozen layer: the turn's uid's files), the
    listing and digests its reader makes of it (``docker._reader``)."""
    if not _reads_by_reader(executor, snapshot):
        return scan_tree(snapshot.path, **bounds).content_id
    fd = int(snapshot.path.name)  # a held layer's tree is /proc/self/fd/N
    with executor.sandbox._read_layer(fd) as layer:  # type: ignore[attr-defined]
        listing = json.loads(layer.listing("", bounds["max_files"]))
        files = [(os.fsencode(e["name"]), e["size"]) for e in listing if e["kind"] == "file"]
        return listing, layer.digests(files)


def _reads_by_reader(executor: Executor, snapshot: TurnSnapshot) -> bool:
    return executor.sandbox.name == "docker" and os.geteuid() != 0 and snapshot.layer is not None


def test_a_fork_changes_neither_the_snapshots_tree_nor_its_siblings(executor: Executor):
    """Whatever a fork does to the files it opened with, the snapshot's tree on the host
    keeps its content id and a sibling still sees the snapshot's files."""
    with executor.turn() as parent:
        run_script(
            parent,
            "cd /workspace && echo kept > kept && echo gone > gone && echo moved > moved && "
            "mkdir -p deep empty tree/a && echo inner > deep/inner && echo t > tree/a/t",
        )
        before = run_script(parent, _LISTING)
        tamperer, sibling = parent.fork(2)
    snapshot = tamperer.snapshot_source
    assert snapshot is not None
    bounds = {"max_bytes": 1 << 30, "max_files": 1000}
    held = _layer_state(executor, snapshot, bounds)
    if snapshot.layer is None:
        assert held == snapshot.content_id
    # else a frozen layer: the turn's whole workspace, its outbox too (which the snapshot
    # leaves out, and a turn opened from it clears in its overlay)
    with tamperer, sibling:
        assert run_script(sibling, _LISTING) == before  # the sibling's sandbox runs first
        run_script(tamperer, _TAMPER)
        seen = run_script(tamperer, "cd /workspace && ls && stat -c %a kept && cat kept")
        assert seen == "away\ndeep\nempty2\nkept\nkept.hard\noutbox\nsetid\n777\nkept\nchanged\n"
        assert run_script(tamperer, "find /workspace -perm /6000") == ""
        assert _layer_state(executor, snapshot, bounds) == held
        assert run_script(sibling, _LISTING) == before
    with executor.turn(snapshot=snapshot) as again:
        assert run_script(again, _LISTING) == before


def test_a_forks_writes_count_against_its_disk_limit(executor: Executor):
    """A fork's own layer is its workspace's tmpfs: rewriting the snapshot's files and
    writing past ``disk_mb`` fails as in any turn, and the snapshot is unchanged."""
    with executor.turn() as parent:
        run_script(parent, "head -c 6291456 /dev/urandom > /workspace/six")
        (fork,) = parent.fork(1)
    with fork:
        # Rewriting the file copies its six MiB up into the fork's layer: two more files
        # of six pass the disk's sixteen.
        script = "cd /workspace && echo x >> six && cat six > one && cat six > two"
        full = fork.exec(["sh", "-c", script])
        assert full.returncode != 0
        assert b"No space left" in full.stderr
        left = run_script(fork, "cd /workspace && rm one two && stat -c %s six")
        assert left == "6291458\n"
    assert fork.snapshot_source is not None
    assert (fork.snapshot_source.path / "six").stat().st_size == 6291456


def test_a_snapshot_of_a_fork_is_the_forks_files(executor: Executor):
    """A fork's own snapshot is what it shows: its writes, never a removed file or the
    overlay's bookkeeping (a whiteout, a folder removed and made again)."""
    with executor.turn() as parent:
        run_script(
            parent, "cd /workspace && mkdir -p a/b e && echo 1 > a/b/f && echo 2 > g && : > e/x"
        )
        (fork,) = parent.fork(1)
    with fork:
        run_script(
            fork, "cd /workspace && rm g && rm -r e && mkdir e && : > e/y && echo 9 >> a/b/f"
        )
        names = sorted(entry.name for entry in fork.snapshot().manifest.entries)
        assert names == [b"a", b"a/b", b"a/b/f", b"e", b"e/y"]
        (grandchild,) = fork.fork(1)
    with grandchild:
        assert run_script(grandchild, "cd /workspace && ls e && cat a/b/f") == "y\n1\n9\n"


def test_a_writable_root_turn_opens_from_a_snapshot_by_copy(
    backend: Sandbox, agent_dir: Path, data_dir: Path, executor: Executor
):
    """The writable root's layers live in the workspace's own tmpfs, so such a turn
    copies the snapshot's files in, and both its workspace and its root are writable."""
    with executor.turn() as turn:
        run_script(turn, "echo hi > /workspace/f")
        snapshot = turn.snapshot()
    roomy = Limits(disk_mb=64, memory_mb=256, processes=48, open_files=256)  # the root's folders
    rooted = suite_executor(backend, agent_dir, data_dir, writable_root=True, limits=roomy)
    with rooted, rooted.turn(snapshot=snapshot) as opened:
        script = "cat /workspace/f && echo x >> /workspace/f && echo y > /usr/local/y && echo ok"
        assert run_script(opened, script) == "hi\nok\n"


def test_the_mechanism_is_the_backends(executor: Executor):
    """bubblewrap, nsjail and Docker (as root) open a snapshot as an overlay on its tree (a
    copy elsewhere);
    either way the calls own the files they opened with and may replace them."""
    with executor.turn() as parent:
        run_script(parent, "mkdir /workspace/d && echo base > /workspace/d/f")
        (fork,) = parent.fork(1)
    with fork:
        mounted = run_script(fork, "grep ' /workspace ' /proc/self/mountinfo | tail -n 1")
        # Docker's overlay of a fresh turn's frozen layer: the host's as root, the
        # server's on its reader's idmapped clone as an ordinary user.
        overlay = overlay_backend(executor.sandbox.name)
        assert (" - overlay " in mounted) is overlay, mounted
        mine = "id -u; stat -c %u /workspace/d /workspace/d/f"
        uid = run_script(fork, "id -u").strip()
        assert run_script(fork, mine).split() == [uid, uid, uid]
        run_script(
            fork, "echo more >> /workspace/d/f && touch /workspace/d/new && rm /workspace/d/f"
        )
        assert run_script(fork, "ls /workspace/d") == "new\n"


def test_forks_racing_each_other_stay_apart(executor: Executor):
    """Forks driven from threads at once each see the snapshot and only their own writes."""
    with executor.turn() as parent:
        run_script(parent, "seq 1 1000 > /workspace/numbers")
        forks = parent.fork(4)

    def work(index: int) -> str:
        with forks[index] as fork:
            run_script(fork, f"echo {index} >> /workspace/numbers && touch /workspace/mine{index}")
            return run_script(
                fork, "tail -n 1 /workspace/numbers; wc -l < /workspace/numbers; ls /workspace"
            )

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        seen = list(pool.map(work, range(4)))
    assert seen == [f"{i}\n1001\nmine{i}\nnumbers\noutbox\n" for i in range(4)]


def test_a_fifo_is_refused_by_name(executor: Executor):
    """A fifo a call made refuses the snapshot, naming it (calls can make no device or socket)."""
    with executor.turn() as turn:
        run_script(turn, "mkdir /workspace/d && mkfifo /workspace/d/pipe")
        with pytest.raises(SnapshotError, match="'d/pipe' is a fifo"):
            turn.snapshot()
        assert executor.snapshot_budget.used_bytes == 0
        run_script(turn, "rm /workspace/d/pipe")
        assert turn.snapshot().file_count == 1


def test_set_id_bits_never_come_back(executor: Executor):
    """A fork's files have the parent's modes without set-id bits (noted when any were set)."""
    with executor.turn() as turn:
        run_script(
            turn, "cd /workspace && cp /bin/true t && mkdir d && (chmod 6755 t; chmod 2775 d; true)"
        )
        modes = [
            int(mode, 8)
            for mode in run_script(turn, "stat -c %a /workspace/t /workspace/d").split()
        ]
        snapshot = turn.snapshot()
    if any(mode & 0o6000 for mode in modes):  # the sandbox let the call set them
        assert "set-id bits dropped" in " ".join(snapshot.notes)
    with executor.turn(snapshot=snapshot) as fork:
        restored = run_script(fork, "stat -c %a /workspace/t /workspace/d").split()
    assert [int(mode, 8) for mode in restored] == [mode & ~0o6000 for mode in modes]


def test_many_small_files_come_back(executor: Executor):
    """Three thousand files in a hundred folders are captured and restored, every one."""
    with executor.turn() as turn:
        run_script(
            turn,
            "cd /workspace && for d in $(seq 100); do mkdir $d && "
            "(cd $d && for f in $(seq 30); do echo $d.$f > $f; done); done",
        )
        snapshot = turn.snapshot()
    assert snapshot.file_count == 3100
    with executor.turn(snapshot=snapshot) as restored:
        assert (
            run_script(restored, "cat /workspace/*/* | wc -l; cat /workspace/77/13")
            == "3000\n77.13\n"
        )


def test_a_snapshot_is_a_value_named_by_its_files(executor: Executor):
    """Two snapshots of the same files are equal and hash alike; a changed byte makes another."""
    with executor.turn() as turn:
        run_script(turn, "echo a > /workspace/f")
        first, second = turn.snapshot(), turn.snapshot()
        run_script(turn, "echo b > /workspace/f")
        third = turn.snapshot()
    assert first == second
    assert hash(first) == hash(second)
    assert first.content_id.startswith("sha256:")
    assert third != first
    assert len({first, second, third}) == 2


def test_the_budget_refuses_a_snapshot_past_it(backend: Sandbox, agent_dir: Path, data_dir: Path):
    """Snapshots count against the executor's budget until they are dropped (and removed)."""
    executor = suite_executor(backend, agent_dir, data_dir, snapshot_budget_mb=3)
    with executor, executor.turn() as turn:
        run_script(turn, "head -c 2097152 /dev/zero > /workspace/two")
        kept = turn.snapshot()
        assert executor.snapshot_budget.used_bytes == 2 << 20
        run_script(turn, "cd /workspace && rm two && head -c 2097152 /dev/zero > other")
        with pytest.raises(SnapshotError, match=r"budget of 3\.0 MiB"):
            turn.snapshot()
        path = kept.path
        del kept
        assert drain(60)
        assert not path.exists()
        assert executor.snapshot_budget.used_bytes == 0
        assert turn.snapshot().total_bytes == 2 << 20


def test_a_sparse_file_counts_its_holes(backend: Sandbox, agent_dir: Path, data_dir: Path):
    """A sparse file is its bytes, holes included: one past the budget refuses the snapshot."""
    executor = suite_executor(backend, agent_dir, data_dir, snapshot_budget_mb=8)
    with executor, executor.turn() as turn:
        run_script(turn, "truncate -s 12M /workspace/hole")
        with pytest.raises(SnapshotError, match="sparse file counts its holes"):
            turn.snapshot()


def test_a_snapshot_past_the_turns_disk_is_refused(
    backend: Sandbox, agent_dir: Path, data_dir: Path, executor: Executor
):
    """A turn whose disk limit cannot hold the snapshot refuses to open from it."""
    with executor.turn() as turn:
        run_script(turn, "head -c 6291456 /dev/zero > /workspace/six")
        snapshot = turn.snapshot()
    small = Limits(disk_mb=4, memory_mb=256, processes=48, open_files=256)
    tight = suite_executor(backend, agent_dir, data_dir, limits=small)
    with (
        tight,
        tight.turn(snapshot=snapshot) as restored,
        pytest.raises(SnapshotError, match="do not fit this turn's workspace"),
    ):
        restored.exec(["true"])


def test_wrong_arguments_are_the_hosts_mistake(executor: Executor, turn: Turn):
    """A snapshot that is not one, a fork count that is not one: UsageError naming them."""
    with pytest.raises(UsageError, match="snapshot is a TurnSnapshot"):
        executor.turn(snapshot="/tmp/saved.tar")  # type: ignore[arg-type]
    for count in (0, -1, True, 2.0):
        with pytest.raises(UsageError, match="whole number of turns"):
            turn.fork(count)  # type: ignore[arg-type]
    assert isinstance(turn.snapshot(), TurnSnapshot)


def test_warm_turns_start_with_the_executors_snapshot(
    backend: Sandbox, agent_dir: Path, data_dir: Path, executor: Executor
):
    """``Executor(warm=N, snapshot=s)`` keeps sandboxes ready with s's files, one per turn."""
    with executor.turn() as turn:
        run_script(turn, "echo ready > /workspace/f")
        snapshot = turn.snapshot()
    warm = suite_executor(backend, agent_dir, data_dir, warm=2, snapshot=snapshot)
    with warm:
        assert warm.wait_warm(120)
        with warm.turn() as first, warm.turn() as second:
            run_script(first, "echo first >> /workspace/f")
            assert run_script(second, "cat /workspace/f") == "ready\n"
            assert run_script(first, "cat /workspace/f") == "ready\nfirst\n"


def test_a_saved_snapshot_opens_in_another_process(executor: Executor, tmp_path: Path):
    """A snapshot saved here is loaded, checked and opened as a turn by a separate Python."""
    with executor.turn() as turn:
        run_script(
            turn, "mkdir -p /workspace/d && echo saved > /workspace/d/f && ln -s d/f /workspace/l"
        )
        snapshot = turn.snapshot()
    saved = tmp_path / "turn.snapshot"
    snapshot.save(saved)
    saved.chmod(0o644)
    script = (
        "import sys\n"
        "from astralvessel import Executor, Registry, TurnSnapshot\n"
        "loaded = TurnSnapshot.load(sys.argv[1])\n"
        "print(loaded.content_id)\n"
        "with Executor(Registry(), sandbox=sys.argv[2]) as executor:\n"
        "    with executor.turn(snapshot=loaded) as turn:\n"
        "        print(turn.exec(['cat', '/workspace/l']).stdout.decode(), end='')\n"
    )
    name = executor.sandbox.name
    result = subprocess.run(
        [sys.executable, "-c", script, str(saved), name],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{snapshot.content_id}\nsaved\n"


def test_a_fork_of_an_unstarted_fork_is_the_same_snapshot(executor: Executor):
    """A turn whose sandbox has not started yet snapshots as the snapshot it opened from."""
    with executor.turn() as parent:
        run_script(parent, "echo one > /workspace/f")
        (child,) = parent.fork(1)
    with child:
        assert child.snapshot() is child.snapshot_source
        (grandchild,) = child.fork(1)
        run_script(child, "echo two >> /workspace/f")
        assert child.snapshot() != child.snapshot_source
    with grandchild:
        assert run_script(grandchild, "cat /workspace/f") == "one\n"


def test_a_fork_nested_900_folders_deep_is_snapshotted_whole(executor: Executor):
    """A fork whose calls nest 900 folders (past the upper layer listing's UPPER_DEPTH, so
    its changed names are unknown) is snapshotted file for file, the parent's too: every
    file read, none taken for the lower layer's unread, and a turn opened from it has them."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/base && mkdir /workspace/keep")
        (fork,) = parent.fork(1)
    deep = "/".join(["d"] * 900)
    with fork:
        run_script(
            fork,
            f"cd /workspace && mkdir -p {deep} && echo bottom > {deep}/f && echo more >> base",
        )
        before = run_script(fork, _LISTING)
        snapshot = fork.snapshot()
    assert (snapshot.path / deep / "f").read_bytes() == b"bottom\n"
    assert (snapshot.path / "base").read_bytes() == b"base\nmore\n"
    assert snapshot.file_count == 900 + 3
    with executor.turn(snapshot=snapshot) as restored:
        assert run_script(restored, _LISTING) == before


def test_a_forks_outbox_holds_none_of_its_parents_files(executor: Executor) -> None:
    """A snapshot leaves the outbox out, so a fork's starts empty, whether it opened from
    a store tree or a frozen layer (the parent's whole workspace, its outbox included)."""
    with executor.turn() as parent:
        run_script(parent, "echo handed > /workspace/outbox/handed && echo kept > /workspace/k")
        (fork,) = parent.fork(1)
        with fork:
            assert run_script(fork, "find /workspace/outbox -type f") == ""
            assert run_script(fork, "cat /workspace/k") == "kept\n"
        assert run_script(parent, "cat /workspace/outbox/handed") == "handed\n"


def _ordinary_docker(executor: Executor) -> None:
    if executor.sandbox.name != "docker" or os.geteuid() == 0:
        pytest.skip("the reader of frozen layers serves an ordinary user's Docker host")


def test_an_ordinary_users_docker_fork_freezes_the_workspace_in_place(executor: Executor):
    """As an ordinary user a fresh Docker turn's fork copies nothing: its snapshot is the
    frozen layer, listed and hashed by the host's reader, and each fork lays its overlay
    on an idmapped clone of it, so its calls own the files (a 0600 file in a 0700 folder,
    which the host itself cannot read) and its writes reach neither siblings nor parent."""
    _ordinary_docker(executor)
    with executor.turn() as parent:
        run_script(
            parent,
            "cd /workspace && mkdir -m 700 d && echo base > d/f && chmod 600 d/f && echo t > t",
        )
        one, two = parent.fork(2)
        snapshot = one.snapshot_source
        assert snapshot is not None
        assert snapshot.layer is not None  # frozen in place, not copied to the store
        with pytest.raises(PermissionError):
            os.open(snapshot.path / "d" / "f", os.O_RDONLY)  # the host cannot read it
        with one, two:
            mounts = run_script(one, "grep ' /workspace' /proc/self/mountinfo")
            assert " - overlay " in mounts
            assert "idmapped" in mounts
            uid = run_script(one, "id -u").strip()
            assert run_script(one, "stat -c %u /workspace/d /workspace/d/f").split() == [uid] * 2
            run_script(
                one, "echo one >> /workspace/d/f && rm /workspace/t && chmod 755 /workspace/d"
            )
            run_script(two, "echo two >> /workspace/d/f")
            assert run_script(one, "cat /workspace/d/f; ls /workspace") == "base\none\nd\noutbox\n"
            assert run_script(two, "cat /workspace/d/f") == "base\ntwo\n"
            assert run_script(parent, "cat /workspace/d/f /workspace/t") == "base\nt\n"
            assert run_script(parent, "stat -c %a /workspace/d") == "700\n"


def test_an_ordinary_users_docker_fork_takes_no_word_of_the_turn(executor: Executor):
    """The frozen layer's listing and digests are the reader's, checked as a capture's: names
    and bytes shaped like its replies (quotes, newlines, bytes not UTF-8, a frame's header)
    come out as a capture of the same files has them, and the reader's socket is in no
    turn's view."""
    _ordinary_docker(executor)
    with executor.turn() as parent:
        run_script(
            parent,
            "cd /workspace && printf '\\000\\000\\000\\002\\000\\000\\000\\000{}' > frame && "
            "echo q > 'a\"b' && echo n > \"$(printf 'x\\ny')\" && echo u > \"$(printf '\\377')\" && "
            'printf \'{"errno": null, "digests": []}\' > \'{"op": "hash"}\' && ln -s /etc link',
        )
        (fork,) = parent.fork(1)
        frozen = fork.snapshot_source
        assert frozen is not None
        assert frozen.layer is not None
        copied = parent.snapshot()  # the file worker's listing and the host's digests
        assert copied.layer is None
        assert frozen.content_id == copied.content_id
        with fork:
            socks = run_script(fork, "find / -xdev -type s 2>/dev/null; true")
            assert "server.sock" not in socks


def test_an_ordinary_users_docker_fork_refuses_a_hostile_layer(executor: Executor):
    """A layer a capture refuses (a fifo) refuses the fork by name, as the root route does,
    and leaves nothing counted; without it the fork freezes."""
    _ordinary_docker(executor)
    with executor.turn() as parent:
        run_script(parent, "mkdir /workspace/d && mkfifo /workspace/d/pipe")
        with pytest.raises(SnapshotError, match="'d/pipe' is a fifo"):
            parent.fork(1)
        assert executor.snapshot_budget.used_bytes == 0
    with executor.turn() as parent:
        run_script(parent, "echo a > /workspace/a")
        (fork,) = parent.fork(1)
        with fork:
            assert fork.snapshot_source is not None
            assert fork.snapshot_source.layer is not None
            assert run_script(fork, "cat /workspace/a") == "a\n"


def test_an_ordinary_users_docker_reader_follows_no_link_out_of_the_layer(executor: Executor):
    """The reader reads any file it is pointed at, so it opens a name folder by folder from
    the layer, following no link: a name through a link in the layer (here to the image's
    own ``/usr``, the reader's too) is refused, never hashed, whatever the host asks."""
    _ordinary_docker(executor)
    from astralvessel.sandbox.docker._reader import LayerRefusedError

    with executor.turn() as parent:
        run_script(parent, "ln -s /usr /workspace/link && echo a > /workspace/a")
        size = int(run_script(parent, "stat -Lc %s /usr/lib/os-release"))
        (fork,) = parent.fork(1)
        with fork:
            snapshot = fork.snapshot_source
            assert snapshot is not None
            held = snapshot.held_layer
            assert held is not None
            with executor.sandbox._read_layer(held) as layer:  # type: ignore[attr-defined]
                layer.listing("outbox", 100)
                assert len(layer.digests([(b"a", 2)])) == 1
                with pytest.raises(LayerRefusedError, match="link/lib/os-release") as out:
                    layer.digests([(b"link/lib/os-release", size)])
                assert out.value.errno in {errno.ELOOP, errno.ENOTDIR}


def test_an_ordinary_users_docker_fork_copies_where_the_reader_cannot_idmap(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """A reader that cannot make a fork's idmapped clone (a kernel or security module that
    refuses it) reads no layer: the fork copies, and starts, rather than fail."""
    _ordinary_docker(executor)
    from astralvessel.sandbox.docker import _reader

    refusing = _reader.reader_code().replace(
        "\n_sock = socket.socket(",
        "\ndef _idmapped(layer, uid, gid):\n    raise OSError(1, 'refused')\n"
        "\n_sock = socket.socket(",
    )
    monkeypatch.setattr(_reader, "reader_code", lambda: refusing)
    backend = executor.sandbox
    backend._reader = None  # type: ignore[attr-defined]  # a new reader, of that code
    try:
        with executor.turn() as parent:
            run_script(parent, "echo a > /workspace/a && chmod 600 /workspace/a")
            (fork,) = parent.fork(1)
            with fork:
                assert fork.snapshot_source is not None
                assert fork.snapshot_source.layer is None  # copied
                assert run_script(fork, "echo b >> /workspace/a; cat /workspace/a") == "a\nb\n"
            assert run_script(parent, "cat /workspace/a") == "a\n"
    finally:
        backend._reader = None  # type: ignore[attr-defined]  # the next test's is our own
