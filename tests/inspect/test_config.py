"""The provider's configuration and how inspect finds the provider."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
from inspect_ai.util import SandboxEnvironmentSpec

from astralvessel.errors import ConfigError
from astralvessel.integrations.inspect_ai import VesselSandboxConfig, VesselSandboxEnvironment


def test_folder_path_is_the_agent() -> None:
    """A plain string configuration, as in ``("astralvessel", "path")``, names the agent folder."""
    assert VesselSandboxConfig.of("some/agent") == VesselSandboxConfig(agent="some/agent")
    assert VesselSandboxConfig.of(None) == VesselSandboxConfig()


def test_unknown_backend_is_refused() -> None:
    """A backend name that does not exist is refused when the configuration is built."""
    with pytest.raises(pydantic.ValidationError, match="unknown backend 'bwrap'"):
        VesselSandboxConfig(backend="bwrap")


def test_unknown_promise_is_refused() -> None:
    """Relaxing a promise that does not exist is refused when the configuration is built."""
    with pytest.raises(pydantic.ValidationError, match="unknown promise 'no-internet'"):
        VesselSandboxConfig(relax=("no-internet",))


def test_unknown_field_is_refused() -> None:
    """A misspelt field is an error, not silently ignored."""
    with pytest.raises(pydantic.ValidationError, match="backnd"):
        VesselSandboxConfig.model_validate({"backnd": "nsjail"})


def test_configuration_is_frozen() -> None:
    """The configuration cannot change after it is checked."""
    config = VesselSandboxConfig(backend="nsjail")
    with pytest.raises(pydantic.ValidationError):
        config.backend = "bwrap"  # type: ignore[misc]


def test_other_configuration_types_are_refused() -> None:
    """Another provider's configuration model is a clear TypeError, not a confusing failure."""

    class Other(pydantic.BaseModel):
        image: str = "x"

    with pytest.raises(TypeError, match="VesselSandboxConfig, not Other"):
        VesselSandboxConfig.of(Other())


def test_configuration_survives_an_eval_log() -> None:
    """A spec stored in a log as JSON comes back as the same configuration."""
    spec = SandboxEnvironmentSpec(
        "astralvessel", VesselSandboxConfig(agent="a", backend="nsjail", relax=("seccomp",))
    )
    again = SandboxEnvironmentSpec.model_validate_json(spec.model_dump_json())
    assert again == spec
    assert isinstance(again.config, VesselSandboxConfig)


async def test_bad_agent_folder_fails_task_init(tmp_path: Path) -> None:
    """A broken agent folder fails at task_init, before any sample starts."""
    (tmp_path / "vessel.toml").write_text("name = 3\n")
    with pytest.raises(ConfigError, match=r"vessel\.toml"):
        await VesselSandboxEnvironment.task_init("broken", str(tmp_path))


def test_inspect_finds_the_provider_by_name() -> None:
    """A fresh interpreter finds "astralvessel" through inspect's entry points, importing nothing of ours."""
    code = (
        "from inspect_ai.util._sandbox.registry import registry_find_sandboxenv\n"
        "print(registry_find_sandboxenv('astralvessel').__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "VesselSandboxEnvironment", done.stderr
