"""Fixtures for the inspect_ai provider's tests: inspect_ai installs on Python 3.11 and later."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

# inspect_ai does not install on 3.10 (the `inspect` extra says so): there is nothing to test.
collect_ignore_glob = ["test_*.py"] if sys.version_info < (3, 11) else []

#: The backends the provider runs on in CI; ids carry the name, so CI's backend filter applies.
BACKENDS = ["bubblewrap", "nsjail", "docker"]

#: inspect_ai never closes the receive end of each sample's hook-event stream
#: (``start_sample_event_emitter`` in its ``hooks/_hooks.py``; ``drain_sample_events`` closes
#: the send end and drops the other), so every sample of an eval leaves one for the collector,
#: and anyio warns when it is freed: ignored by that message and anyio's module only, on the
#: tests whose evals make them.
IGNORE_INSPECTS_UNCLOSED_SAMPLE_STREAM = pytest.mark.filterwarnings(
    "ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning:anyio.streams.memory"
)


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_in_its_own_module() -> Iterator[None]:
    """Free each module's cyclic garbage as its last test ends, under that module's warning
    filters: what warns when collected (an unclosed stream) then fails a test of the module
    that left it, not whichever later test the collector happens to run in (one CI run failed
    test_provider's test_many_commands_at_once, which leaks nothing, with a stream an eval
    test had left). Once a module, not once a test: a collection costs about 0.1 s here."""
    yield
    gc.collect()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark inspect's self-check ``slow``: its checks (inspect's own, of any provider) go through
    the provider code this package's other inspect tests run on every Python; on the
    full-matrix Python it runs whole, as root and as the calls' ordinary user."""
    for item in items:
        if item.path.name == "test_self_check.py":
            item.add_marker(pytest.mark.slow)
