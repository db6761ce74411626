"""The engine gate: how many runc requests one host process sends at once, and what is repeated."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest
import requests

import docker
from astralvessel.errors import BackendUnavailableError, UsageError
from astralvessel.sandbox import Policy
from astralvessel.sandbox.docker import Docker
from astralvessel.sandbox.docker._gate import (
    CONCURRENCY_ENV,
    DEFAULT_CONCURRENCY,
    GatedApi,
    Gates,
    resolve_concurrency,
    retry_delay,
)
from astralvessel.sandbox.docker._spec import LABEL_OWNER, container_spec

from .conftest import BASE_IMAGE


def _answer(status: int) -> docker.errors.APIError:
    """The SDK's error for an engine that answered ``status``."""
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError(f"engine answered {status}", response=response)


class _Engine:
    """Stands in for the SDK client: records how many gated requests overlap."""

    def __init__(self, meet: threading.Barrier | None = None) -> None:
        self.meet = meet
        self.lock = threading.Lock()
        self.active = 0
        self.most = 0
        self.failures: list[BaseException] = []
        self.calls = 0

    def start(self, _container: str) -> None:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        try:
            if self.meet is not None:
                self.meet.wait()
        finally:
            with self.lock:
                self.active -= 1

    def remove_container(self, _container: str, *, force: bool) -> None:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)

    def inspect_container(self, container: str) -> dict[str, Any]:
        return {"Id": container}


def test_the_gate_lets_exactly_its_size_through_at_once() -> None:
    """Twelve threads starting containers through a gate of 3: three meet inside, never four."""
    engine = _Engine(meet=threading.Barrier(3, timeout=30))
    api = GatedApi(engine, Gates(3))
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        # A broken barrier (fewer than 3 let in together) raises here.
        list(pool.map(api.start, [str(n) for n in range(12)]))
    assert engine.most == 3


def test_reads_pass_a_full_gate() -> None:
    """An inspect is not a runc request: it answers while every runc slot is held."""
    gates = Gates(1)
    api = GatedApi(_Engine(), gates)
    with gates.runc:
        assert api.inspect_container("c0ffee") == {"Id": "c0ffee"}


def test_each_request_is_counted_by_its_kind() -> None:
    """Starts and execs count as runc requests, inspects as reads; wait and attach are not counted."""
    gates = Gates(2)
    assert gates.for_method("start") is gates.runc
    assert gates.for_method("exec_start") is gates.runc
    assert gates.for_method("exec_inspect") is gates.reads
    assert gates.for_method("wait") is None  # lasts as long as its container
    assert gates.for_method("attach_socket") is None
    assert gates.pool_size == 2 + 8 + 4


@pytest.mark.parametrize(
    ("failures", "calls"),
    [
        ([_answer(409), _answer(500)], 3),  # another removal under way, then a busy layer
        ([_answer(404)], 1),  # gone already: the caller's answer, not repeated
        ([_answer(400)], 1),  # our mistake: repeating cannot help
        ([requests.exceptions.ReadTimeout("no answer")], 1),  # a silent engine gets no more
    ],
)
def test_only_removals_the_engine_calls_passing_are_repeated(
    failures: list[BaseException], calls: int
) -> None:
    """A removal is repeated on 409 and 500 only; 404, 400 and no answer reach the caller at once."""
    engine = _Engine()
    engine.failures = list(failures)
    api = GatedApi(engine, Gates(2))
    last = failures[-1]
    if calls > len(failures):
        api.remove_container("c0ffee", force=True)
    else:
        with pytest.raises(type(last)):
            api.remove_container("c0ffee", force=True)
    assert engine.calls == calls


def test_repeats_stop_after_the_tables_pauses() -> None:
    """A removal the engine keeps refusing with 500 is given up after the table's pauses."""
    assert retry_delay("remove_container", 500, 1) == 0.2
    assert retry_delay("remove_container", 500, 5) is None
    assert retry_delay("start", 500, 1) is None
    assert retry_delay("remove_container", None, 1) is None


def test_the_bound_comes_from_the_argument_the_environment_or_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """engine_concurrency wins over $ASTRALVESSEL_DOCKER_CONCURRENCY, which wins over 8."""
    monkeypatch.delenv(CONCURRENCY_ENV, raising=False)
    assert resolve_concurrency(None) == DEFAULT_CONCURRENCY == 8
    monkeypatch.setenv(CONCURRENCY_ENV, " 3 ")
    assert resolve_concurrency(None) == 3
    assert resolve_concurrency(5) == 5


@pytest.mark.parametrize("value", [0, -1, 257, True, 2.5, "many"])
def test_a_bound_that_is_not_a_count_is_refused(value: object) -> None:
    """0, a negative, too many, a bool, a float or a word is a UsageError naming the setting."""
    with pytest.raises(UsageError, match="engine_concurrency"):
        resolve_concurrency(value)  # type: ignore[arg-type]


def test_a_bad_environment_bound_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad $ASTRALVESSEL_DOCKER_CONCURRENCY is refused by name when the backend is made."""
    monkeypatch.setenv(CONCURRENCY_ENV, "lots")
    with pytest.raises(UsageError, match=CONCURRENCY_ENV):
        Docker(base_image=BASE_IMAGE, pull=False)


def test_backends_of_one_engine_and_setting_share_one_gate(docker_api: object) -> None:
    """Two Docker backends of this process with the same engine and bound count together."""
    one = Docker(base_image=BASE_IMAGE, pull=False, engine_concurrency=4)
    two = Docker(base_image=BASE_IMAGE, pull=False, engine_concurrency=4)
    other = Docker(base_image=BASE_IMAGE, pull=False, engine_concurrency=5)
    assert one.engine._gate is two.engine._gate
    assert other.engine._gate is not one.engine._gate


def test_a_container_the_engine_cannot_start_is_one_clear_error(docker_api: Any) -> None:
    """A start the engine refuses raises BackendUnavailableError naming the step; nothing is left."""
    backend = Docker(base_image=BASE_IMAGE, pull=False)
    image = backend.engine.ensure_image(BASE_IMAGE)
    label = "astralvessel-gate-test"
    spec = container_spec(
        Policy(),
        image=image,
        command=["/no/such/program"],
        seccomp_profile={"defaultAction": "SCMP_ACT_ALLOW"},
        labels={LABEL_OWNER: label},
        server=False,
    )
    with pytest.raises(BackendUnavailableError, match="refused to start it") as caught:
        backend.engine.start_container(spec)
    assert "/no/such/program" in str(caught.value)
    assert docker_api.containers(all=True, filters={"label": f"{LABEL_OWNER}={label}"}) == []


def test_a_container_the_engine_will_not_create_is_one_clear_error(docker_api: Any) -> None:
    """More CPUs than the machine has: the engine's refusal to create is named, not a bare HTTP error."""
    backend = Docker(base_image=BASE_IMAGE, pull=False, cpus=4096.0)
    with pytest.raises(BackendUnavailableError, match="refused to create it") as caught:
        backend.start(Policy())
    assert "CPU" in str(caught.value)
