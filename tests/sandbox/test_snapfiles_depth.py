"""The file worker's walks of a workspace and of its upper layer: a tree nested as deep as
a call likes costs neither the stack nor descriptors, and the upper layer's listing gives
up past ``UPPER_DEPTH`` (unknown: the snapshot reads every file).

``_snapfiles`` runs in the sandbox's server on the stdlib alone; these run it on
host folders, where a test can bound the descriptors a process may open.
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from types import SimpleNamespace

import pytest

from astralvessel.sandbox.server import _snapfiles
from astralvessel.sandbox.server._snapfiles import UPPER_DEPTH, pack, upper_names


def _nest(root: Path, depth: int) -> bytes:
    """``depth`` folders, one in the other, with a file at the bottom; the file's name."""
    name = b"/".join([b"d"] * depth) + b"/f"
    os.makedirs(os.fsencode(root) + b"/" + name.rpartition(b"/")[0])
    with open(os.fsencode(root) + b"/" + name, "wb") as out:
        out.write(b"deep")
    return name


def _upper(root: Path) -> set[bytes] | None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return upper_names(fd)
    finally:
        os.close(fd)


def _in_child_with_few_descriptors(check: str, root: Path) -> int:
    """Run ``check`` (a name below) in a forked child allowed 6 descriptors past the standard
    three; its exit code (0: it held)."""
    pid = os.fork()
    if pid == 0:
        try:
            # The parent's descriptors leave holes (a test runner holds many): a limit past
            # the lowest free one would allow only the holes below it, so close them all.
            os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            resource.setrlimit(resource.RLIMIT_NOFILE, (3 + 6, 3 + 6))
            os._exit(0 if _CHECKS[check](root) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _upper_whole(root: Path) -> bool:
    found = _upper(root)
    return found is not None and len(found) == UPPER_DEPTH


def _listing_whole(root: Path) -> bool:
    fields, body = pack({"phase": "list"}, b"", SimpleNamespace(workspace=str(root)))
    return fields["count"] == 901 and json.loads(body)[-1]["name"].endswith("/f")


_CHECKS = {"upper": _upper_whole, "listing": _listing_whole}


def test_the_upper_layers_names_go_as_deep_as_the_bound(tmp_path: Path):
    """A layer nested UPPER_DEPTH - 1 folders deep is listed whole; one folder deeper, and
    900 deep, it is unknown (None)."""
    within, past, hostile = tmp_path / "within", tmp_path / "past", tmp_path / "hostile"
    deepest = _nest(within, UPPER_DEPTH - 1)
    found = _upper(within)
    assert found is not None
    assert deepest in found
    assert len(found) == UPPER_DEPTH
    _nest(past, UPPER_DEPTH)
    assert _upper(past) is None
    _nest(hostile, 900)
    assert _upper(hostile) is None


def test_the_upper_layers_walk_holds_few_descriptors(tmp_path: Path):
    """A layer UPPER_DEPTH - 1 folders deep is listed whole by a process allowed 6 more
    descriptors (one held per level would need 63)."""
    _nest(tmp_path / "layer", UPPER_DEPTH - 1)
    assert _in_child_with_few_descriptors("upper", tmp_path / "layer") == 0


def test_a_workspace_900_folders_deep_is_listed_whole_with_few_descriptors(tmp_path: Path):
    """The snapshot's listing of a workspace 900 folders deep names every folder and the
    file, in a process allowed 6 more descriptors and Python's own stack."""
    _nest(tmp_path / "ws", 900)
    assert _in_child_with_few_descriptors("listing", tmp_path / "ws") == 0


def test_a_link_on_the_way_is_not_followed(tmp_path: Path):
    """A folder replaced by a link to another is not walked through: unknown, not its names."""
    layer = tmp_path / "layer"
    (layer / "a").mkdir(parents=True)
    (tmp_path / "elsewhere" / "x").mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere", layer / "a" / "l")
    found = _upper(layer)
    assert found == {b"a", b"a/l"}


@pytest.mark.parametrize("depth", [3, 40])
def test_a_restore_holds_one_folder_open(
    tmp_path: Path, depth: int, monkeypatch: pytest.MonkeyPatch
):
    """A restore's records, nested ``depth`` folders deep, are made with few descriptors."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    names = ["/".join(["d"] * level) for level in range(1, depth + 1)]
    records = [["dir", name, 0o755, None, 0, 0, True] for name in names]
    records.append(["file", names[-1] + "/f", 0o644, None, 0, 4, True])
    index = json.dumps(records).encode()
    before = len(os.listdir("/proc/self/fd"))
    opened: list[int] = []
    real_open = os.open

    def counting_open(*args: object, **kwargs: object) -> int:
        fd = real_open(*args, **kwargs)  # type: ignore[arg-type]
        opened.append(len(os.listdir("/proc/self/fd")))
        return fd

    monkeypatch.setattr(os, "open", counting_open)
    _snapfiles.unpack(
        {"index_bytes": len(index)}, index + b"deep", SimpleNamespace(workspace=str(workspace))
    )
    monkeypatch.undo()
    assert (workspace / names[-1] / "f").read_bytes() == b"deep"
    # The listing's own descriptor, the workspace, a folder on its way, one opened: 4.
    assert max(opened) - before <= 4
