"""The exceptions astralvessel raises to the host.

Only the host's mistakes raise; the model's mistakes come back as a
``ToolResult`` with ``is_error=True``. Each error is also the builtin a
caller would naturally catch::

    AstralVesselError(Exception)
    ├── ConfigError(ValueError)                 agent folder or tool file invalid
    ├── BackendUnavailableError(RuntimeError)   a sandbox cannot start here
    │   └── PromiseNotEnforcedError             ... because a promise would be broken
    ├── SandboxError(RuntimeError)              a running sandbox failed (server died, engine gone)
    ├── ToolRegistrationError(ValueError)       a tool cannot join a registry
    ├── ToolError(RuntimeError)                 a Python tool's failure, shown to the model
    │                                            (defined in _pytools, exported at the top)
    └── EgressError(ValueError)                 web: a URL or address the policy refuses
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AstralVesselError",
    "BackendUnavailableError",
    "ConfigError",
    "EgressError",
    "PromiseNotEnforcedError",
    "SandboxError",
    "ToolRegistrationError",
]


class AstralVesselError(Exception):
    """Base of every error this library raises."""


class ConfigError(AstralVesselError, ValueError):
    """An agent folder or tool file is invalid; ``.problems`` lists each one."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        count = len(self.problems)
        head = "1 problem" if count == 1 else f"{count} problems"
        super().__init__(
            f"{head} in the agent folder:\n" + "\n".join(f"  {p}" for p in self.problems)
        )


class BackendUnavailableError(AstralVesselError, RuntimeError):
    """The chosen sandbox cannot start here; the message says why and what to install."""


class PromiseNotEnforcedError(BackendUnavailableError):
    """A backend would break a confinement promise here, so it refuses to start (fail closed)."""

    def __init__(self, backend: str, promise: str, reason: str) -> None:
        self.backend = backend
        self.promise = promise
        self.reason = reason
        super().__init__(
            f"{backend} cannot enforce the promise {promise!r} on this host: {reason}. "
            f"Fix the host, choose another backend, or relax the promise explicitly "
            f"with Policy.relax({promise!r})."
        )


class SandboxError(AstralVesselError, RuntimeError):
    """A running sandbox failed: its server died, its engine went away, or it broke protocol."""


class ToolRegistrationError(AstralVesselError, ValueError):
    """A tool cannot join a registry: its name is taken, shadows a built-in, or is malformed."""


class EgressError(AstralVesselError, ValueError):
    """The egress policy refuses a URL or an address; the message is safe to show a model."""
