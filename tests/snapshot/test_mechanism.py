"""Which mechanism opens a turn from a snapshot: the backend's table, and the kernel's check."""

from __future__ import annotations

import pytest

from astralvessel._executor._snapshot._mechanism import (
    COPY_ON_WRITE,
    MECHANISMS,
    kernel_overlay_problem,
    overlay_backend,
    stacked_lower,
    upper_layer_listed,
)

FILESYSTEMS = "nodev\ttmpfs\nnodev\toverlay\n\text4\n"


def test_the_backends_with_a_server_lay_an_overlay() -> None:
    """bubblewrap's and nsjail's servers lay it, Docker's host does (as root); docker-exec
    has no server, and unconfined no workspace of its own."""
    overlays = [name for name in MECHANISMS if overlay_backend(name)]
    assert overlays == ["bubblewrap", "nsjail", "docker"]
    assert not overlay_backend("unknown")
    assert "mounted by the host" in MECHANISMS["docker"]


def test_every_overlay_lists_its_upper_layer_but_an_ordinary_users_docker() -> None:
    """A fork's snapshot reads only what its upper layer holds wherever it is an overlay:
    the server keeps that layer's descriptor, or Docker's host as root; an ordinary
    user's Docker copies, and docker-exec has no snapshots."""
    as_root = [name for name in MECHANISMS if upper_layer_listed(name, root=True)]
    as_user = [name for name in MECHANISMS if upper_layer_listed(name, root=False)]
    assert as_root == ["bubblewrap", "nsjail", "docker"]
    assert as_user == ["bubblewrap", "nsjail"]


def test_a_stack_of_layers_is_laid_as_such_but_on_an_ordinary_users_docker() -> None:
    """A fork of a fork's stack: the namespace backends' servers lay their overlay on its
    layers, and Docker's host as root; an ordinary user's Docker forks of a fork capture."""
    as_root = [name for name in MECHANISMS if stacked_lower(name, root=True)]
    as_user = [name for name in MECHANISMS if stacked_lower(name, root=False)]
    assert as_root == ["bubblewrap", "nsjail", "docker"]
    assert as_user == ["bubblewrap", "nsjail"]


@pytest.mark.parametrize(
    ("release", "filesystems", "root", "problem"),
    [
        ("6.18.44-fc-v1147", FILESYSTEMS, True, None),
        ("6.18.44-fc-v1147", FILESYSTEMS, False, None),
        ("5.19.0", FILESYSTEMS, True, None),
        ("5.15.0-91-generic", FILESYSTEMS, True, "Linux 5.15 has no overlays over an idmapped"),
        ("5.15.0-91-generic", FILESYSTEMS, False, None),
        ("5.10.0-28-amd64", FILESYSTEMS, False, "Linux 5.10 has no overlays in a user namespace"),
        ("6.1.0", "nodev\ttmpfs\n\text4", True, "no overlay filesystem"),
        ("6.1.0", "nodev\toverlay", False, None),  # the last line without its newline
        ("weird", FILESYSTEMS, True, "cannot be read"),
    ],
)
def test_the_kernel_check(release: str, filesystems: str, root: bool, problem: str | None) -> None:
    """Root needs an overlay over an idmapped lower layer (5.19), a user one in a user
    namespace (5.11); either needs the overlay filesystem."""
    found = kernel_overlay_problem(release, filesystems, root=root)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


def test_the_table_names_copy_on_write_once() -> None:
    assert COPY_ON_WRITE.startswith("copy-on-write (an overlay")
