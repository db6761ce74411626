"""doctor says who may reach a Docker turn's egress proxy: the sandbox's uid alone, or anyone."""

from __future__ import annotations

from astralvessel.sandbox.docker import Docker
from astralvessel.sandbox.docker._backend import proxy_admission


def test_an_engine_that_maps_uids_leaves_the_proxy_open_and_says_so() -> None:
    """Where the engine hides the sandbox's host uid, the line says the socket is open to all."""
    assert proxy_admission(True).startswith("open to every local user")
    assert proxy_admission(False).startswith("the sandbox's host uid only")


def test_this_engines_report_names_the_proxys_admission() -> None:
    """This host's engine maps no uids (rootful, no userns-remap): its report says uid only."""
    report = Docker().probe()
    assert report.available, report.reason
    assert report.details["egress proxy"] == proxy_admission(False)
