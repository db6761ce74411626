"""Attacks on the file tools: every route out of the agent's data must fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from astralvessel.sandbox.server import _files
from astralvessel.sandbox.server._files import FileContext, handle

from .conftest import CANARY, Call, Tree


def _refused(result: tuple[str, bool]) -> bool:
    text, is_error = result
    return is_error and CANARY not in text


def test_a_link_to_a_host_file_is_refused(tree: Tree, call: Call) -> None:
    """A symlink whose absolute target is outside the data cannot be read."""
    (tree.data / "link").symlink_to(tree.canary)
    result = call("read", path="link")
    assert _refused(result)
    assert "outside the agent's data" in result[0]


def test_a_relative_link_out_is_refused(tree: Tree, call: Call) -> None:
    """A relative symlink climbing out of the data cannot be read."""
    (tree.data / "link").symlink_to("../outside/canary.txt")
    assert _refused(call("read", path="link"))


def test_a_symlinked_parent_is_refused(tree: Tree, call: Call) -> None:
    """A path through a directory link that leads outside cannot be read, listed or globbed."""
    (tree.data / "dir").symlink_to(tree.outside)
    assert _refused(call("read", path="dir/canary.txt"))
    assert _refused(call("list", path="dir"))
    assert _refused(call("glob", pattern="*", path="dir"))


def test_dot_dot_out_of_the_data_is_refused(tree: Tree, call: Call) -> None:
    """'..' past the workdir's root cannot reach a sibling folder."""
    assert _refused(call("read", path="../outside/canary.txt"))
    assert _refused(call("list", path=".."))


def test_dot_dot_through_a_link_follows_the_link_first(tree: Tree, call: Call) -> None:
    """'..' after a link goes to the link target's parent, as the kernel would, and is checked."""
    (tree.outside / "sub" / "canary.txt").write_text(CANARY)
    (tree.data / "hop").symlink_to(tree.outside / "sub")
    assert _refused(call("read", path="hop/../canary.txt"))


def test_dot_dot_inside_the_data_still_works(tree: Tree, call: Call) -> None:
    """'..' that stays inside the data is followed normally."""
    (tree.data / "sub").mkdir()
    (tree.data / "a.txt").write_text("ok\n")
    assert call("read", path="sub/../a.txt") == ("1\tok", False)


def test_an_absolute_path_outside_is_refused(tree: Tree, call: Call) -> None:
    """An absolute path outside every visible root is refused and the roots are named."""
    text, is_error = call("read", path=str(tree.canary))
    assert is_error
    assert CANARY not in text
    assert str(tree.data) in text


@pytest.mark.parametrize(
    "path", ["/proc/self/root{canary}", "/proc/self/cwd/x", "/proc/1/root{canary}", "/"]
)
def test_proc_and_root_are_refused(tree: Tree, call: Call, path: str) -> None:
    """/proc (so /proc/self/root) and / itself are never data."""
    assert _refused(call("read", path=path.format(canary=tree.canary)))


def test_proc_is_never_a_visible_root(tree: Tree) -> None:
    """Even a context that names /proc or / as a root does not make them visible."""
    ctx = tree.context(visible_roots=[str(tree.data), "/proc", "/"])
    assert ctx.visible_roots == [str(tree.data)]
    assert _refused(handle("lines", {"path": f"/proc/self/root{tree.canary}"}, ctx))


def test_a_link_through_proc_is_refused(tree: Tree, call: Call) -> None:
    """A link into /proc/self/root cannot smuggle a host path in."""
    (tree.data / "link").symlink_to(f"/proc/self/root{tree.canary}")
    assert _refused(call("read", path="link"))


def test_a_link_loop_is_an_error(tree: Tree, call: Call) -> None:
    """Links pointing at each other end in an error, not a hang."""
    (tree.data / "a").symlink_to("b")
    (tree.data / "b").symlink_to("a")
    text, is_error = call("read", path="a")
    assert is_error
    assert "too many levels of symbolic links" in text


def test_a_link_inside_the_data_is_followed(tree: Tree, call: Call) -> None:
    """A link whose target stays inside the visible roots reads normally."""
    (tree.workspace / "note.txt").write_text("hi\n")
    (tree.data / "link").symlink_to(tree.workspace / "note.txt")
    assert call("read", path="link") == ("1\thi", False)


@pytest.fixture
def flipping_link(tree: Tree) -> Iterator[Path]:
    """A link swapped between a safe target and the canary as fast as a thread can."""
    safe = tree.data / "safe"
    safe.mkdir()
    (safe / "canary.txt").write_text("harmless\n")
    link = tree.data / "flip"
    stop = threading.Event()

    def flip() -> None:
        staging = tree.data / "flip.tmp"
        while not stop.is_set():
            for target in (safe, tree.outside):
                staging.unlink(missing_ok=True)
                staging.symlink_to(target)
                staging.replace(link)

    link.symlink_to(safe)
    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    yield link
    stop.set()
    thread.join()


def test_a_link_swapped_during_calls_never_leads_outside(tree: Tree, flipping_link: Path) -> None:
    """Hundreds of read, list and glob calls through a racing link never show the canary."""
    ctx = tree.context()
    seen = set()
    for _ in range(300):
        for tool, arguments in (
            ("lines", {"path": "flip/canary.txt"}),
            ("entries", {"path": "flip"}),
            ("find", {"pattern": "*", "path": "flip"}),
        ):
            text, is_error = handle(tool, arguments, ctx)
            assert CANARY not in text
            seen.add((tool, is_error))
    # The race really happened: each view both succeeded and was refused.
    assert {("lines", True), ("lines", False)} <= seen


def test_a_hard_link_cannot_be_made_to_a_file_the_sandbox_user_cannot_read(tree: Tree) -> None:
    """As an unprivileged user, linking a root-only file into the data fails (protected_hardlinks)."""
    with _public_tree() as base:
        secret = base / "secret.txt"
        secret.write_text(CANARY)
        secret.chmod(0o600)
        done = subprocess.run(
            ["ln", str(secret), str(base / "data" / "grab")],
            user=65534,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode != 0
        assert not (base / "data" / "grab").exists()


def test_the_file_tools_never_show_what_the_sandbox_user_cannot_read(tree: Tree) -> None:
    """Run as an unprivileged user, read refuses a root-only file and glob skips a closed folder."""
    with _public_tree() as base:
        data = base / "data"
        (data / "secret.txt").write_text(CANARY)
        (data / "secret.txt").chmod(0o600)
        (data / "closed").mkdir(mode=0o700)
        (data / "closed" / "inner.txt").write_text(CANARY)
        # The whole server package, where nobody can read it: _files imports its siblings.
        shutil.copytree(
            Path(_files.__file__).parent,
            base / "server_copy",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        script = textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(base)!r})
            from server_copy import _files as files
            ctx = files.FileContext({str(data)!r}, [{str(data)!r}])
            print(repr(files.handle("lines", {{"path": "secret.txt"}}, ctx)))
            print(repr(files.handle("find", {{"pattern": "**/*.txt"}}, ctx)))
            print(repr(files.handle("entries", {{"path": "closed"}}, ctx)))
            """
        )
        done = subprocess.run(
            [_python_for_nobody(), "-c", script],
            user=65534,
            capture_output=True,
            text=True,
            check=True,
        )
    read, glob, listing = (eval(line) for line in done.stdout.splitlines())  # noqa: S307 - our own repr output
    assert read[1]
    assert "permission denied" in read[0]
    assert CANARY not in glob[0]
    assert "could not be read" in glob[0]
    assert listing[1]
    assert "permission denied" in listing[0]


def _python_for_nobody() -> str:
    """An interpreter the unprivileged user can run (ours may live in root's home)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            subprocess.run([candidate, "-c", "pass"], user=65534, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            continue
        return candidate
    raise AssertionError("no Python 3 the unprivileged user (uid 65534) can run")


class _public_tree:
    """A world-traversable temporary folder with a data/ inside (pytest's tmp_path is root-only)."""

    def __enter__(self) -> Path:
        self.base = Path(tempfile.mkdtemp(prefix="av-builtins-"))
        self.base.chmod(0o755)
        (self.base / "data").mkdir(mode=0o777)
        (self.base / "data").chmod(0o777)
        return self.base

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.base)


def test_unconfined_mode_works_in_sandbox_paths(tree: Tree) -> None:
    """With a path map, the model sees sandbox paths, and a link to the real host path is outside."""
    (tree.data / "a.txt").write_text("mapped\n")
    (tree.data / "host-link").symlink_to(tree.data / "a.txt")
    ctx = FileContext(
        "/data",
        ["/data", "/workspace"],
        path_map={"/data": str(tree.data), "/workspace": str(tree.workspace)},
    )
    assert handle("lines", {"path": "/data/a.txt"}, ctx) == ("1\tmapped", False)
    assert handle("lines", {"path": "a.txt"}, ctx) == ("1\tmapped", False)
    text, is_error = handle("lines", {"path": "host-link"}, ctx)
    assert is_error
    assert "outside the agent's data" in text
    assert handle("find", {"pattern": "*.txt", "path": "/data"}, ctx) == ("/data/a.txt", False)
    assert handle("entries", {"path": "/"}, ctx)[1]


def test_the_servers_own_context_object_is_accepted(tree: Tree) -> None:
    """A context object with real (already mapped) paths is turned back into sandbox paths."""
    (tree.data / "a.txt").write_text("x\n")

    class ServerContext:
        workdir = str(tree.data)
        visible_roots = (str(tree.data), str(tree.workspace))
        timeout = 5.0
        deadline = None
        path_map: ClassVar[dict[str, str]] = {
            "/data": str(tree.data),
            "/workspace": str(tree.workspace),
        }

    text, is_error = handle("lines", {"path": str(tree.data / "missing")}, ServerContext())  # type: ignore[arg-type]
    assert is_error
    assert text == "/data/missing does not exist."
    assert str(tree.data) not in text
