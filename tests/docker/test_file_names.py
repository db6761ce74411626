"""File names of any bytes over both of Docker's channels: the direct socket and the attach stream."""

from __future__ import annotations

import os

import pytest

from astralvessel.sandbox import FsRequest, Policy, RunRequest
from astralvessel.sandbox.docker import Docker
from astralvessel.sandbox.docker._attach import AttachChannel
from astralvessel.sandbox.docker._direct import DirectChannel

from .conftest import BASE_IMAGE

NAMES = [b"caf\xe9", b"\xff\xfe\x80", b"\xed\xa0\x80", b"a\nb\x1b[0m"]


@pytest.mark.parametrize(("direct", "channel"), [(True, DirectChannel), (False, AttachChannel)])
def test_names_cross_each_channel_as_their_bytes(docker_api, small_policy: Policy, direct, channel):
    """Names the host sends as os.fsdecode escapes are made, listed and read back byte for byte."""
    session = Docker(base_image=BASE_IMAGE, pull=False, direct=direct).start(small_policy)
    try:
        assert isinstance(session._channel, channel)
        for raw in NAMES:
            path = os.fsdecode(b"/workspace/" + raw)
            reply = session.fs(
                FsRequest(op="write", path=path, data=raw, truncate=True, timeout=20)
            )
            assert reply.errno is None, reply.message
        listed = session.fs(FsRequest(op="list", path="/workspace", timeout=20))
        assert {b"file/" + raw for raw in NAMES} <= set(listed.data.split(b"\0"))
        for raw in NAMES:
            read = session.fs(
                FsRequest(op="read", path=os.fsdecode(b"/workspace/" + raw), length=64, timeout=20)
            )
            assert read.data == raw
        shown = session.run(
            RunRequest(
                argv=("python3", "-c", "import os; print(sorted(os.listdir(b'/workspace')))"),
                timeout=20,
                output_chars=4000,
            )
        )
        for raw in NAMES:
            assert repr(raw) in shown.output
    finally:
        session.close()
