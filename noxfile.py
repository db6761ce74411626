"""Development sessions: ``nox -s tests``, ``lint``, ``typing``, ``docs``, ``bench``."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typing", "docs"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
TEST_DEPS = [
    ".[all]",
    "pytest>=8",
    "pytest-asyncio>=0.23",
    "pytest-timeout>=2.3",
    "cryptography>=42",
    "html2text>=2024.2.26",
    "urllib3>=2",
    # The vendors' SDKs, only so their own types can check the shapes we produce.
    "openai>=1.99",
    "anthropic>=0.60",
]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run the whole test suite, real sandboxes included, on one Python."""
    session.install(*TEST_DEPS)
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typing(session: nox.Session) -> None:
    """mypy --strict on the package and on a file that only uses the public API."""
    session.install(
        ".[all]", "mypy>=1.10", "pytest>=8", "types-docker", "types-jsonschema", "tomli"
    )
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the docs with warnings as errors."""
    session.install(".[all]", "sphinx>=7", "myst-parser>=3", "furo")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark; each prints ratios against a baseline measured in the same run."""
    session.install(".[all]", "html2text>=2024.2.26")
    for script in sorted(__import__("pathlib").Path("bench").glob("bench_*.py")):
        session.run("python", str(script), *session.posargs)
