"""The fetch and search subcommands, run in-process against loopback servers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from astralvessel._edges._cli_web import register

from .conftest import TLS, Server


def run(argv: list[str]) -> int:
    """Parse argv with only the web subcommands registered and run the chosen handler."""
    parser = argparse.ArgumentParser(prog="astralvessel")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


def test_fetch_prints_the_wrapped_page(
    http_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """fetch prints what the model would see and exits 0."""
    code = run(["fetch", f"http://127.0.0.1:{http_server.port}/page", "--allow", "127.0.0.1/32"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith(f'<web_content source="http://127.0.0.1:{http_server.port}/page">\n')
    assert "Otters live in" in out


def test_fetch_links_inline(http_server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    """fetch --links inline writes each link with its target, as webfetch did before."""
    url = f"http://127.0.0.1:{http_server.port}"
    code = run(["fetch", f"{url}/page", "--allow", "127.0.0.1/32", "--links", "inline"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"[rivers]({url}/rivers)" in out
    code = run(["fetch", f"{url}/page", "--allow", "127.0.0.1/32", "--full-page"])
    assert "Otters live in rivers." in capsys.readouterr().out


def test_fetch_link_targets(http_server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    """fetch --link-targets numbers the targets, as a call's link_targets does."""
    url = f"http://127.0.0.1:{http_server.port}"
    code = run(["fetch", f"{url}/page", "--allow", "127.0.0.1/32", "--link-targets"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Otters live in [rivers][1].\n\n[1]: /rivers\n</web_content>" in out


def test_fetch_json(https_server: Server, tls: TLS, capsys: pytest.CaptureFixture[str]) -> None:
    """fetch --json prints one JSON object with the result's fields."""
    code = run(
        [
            "fetch",
            f"https://127.0.0.1:{https_server.port}/json",
            "--json",
            "--allow",
            f"127.0.0.1/32 port {https_server.port}",
            "--cafile",
            str(tls.cert_file),
        ]
    )
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    assert payload["is_error"] is False
    assert payload["status"] == 200
    assert '{"otter": "Lutra lutra"}' in payload["text"]


def test_fetch_refusal_exits_one(capsys: pytest.CaptureFixture[str]) -> None:
    """A refused URL prints the refusal and exits 1."""
    assert run(["fetch", "http://169.254.169.254/"]) == 1
    assert "link-local address" in capsys.readouterr().out


def test_fetch_bad_allow_rule_exits_two(capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed allow rule is the operator's error: exit 2 with a message on stderr."""
    assert run(["fetch", "http://example.com/", "--allow", "nonsense"]) == 2
    assert "invalid allow rule" in capsys.readouterr().err


def test_search_local(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """search --provider local searches a folder."""
    (tmp_path / "otters.md").write_text("Otters eat fish.\n")
    code = run(["search", "otters", "--provider", "local", "--index-dir", str(tmp_path)])
    assert code == 0
    assert "1. Otters eat fish.\n   otters.md\n" in capsys.readouterr().out


def test_search_searxng(http_server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    """search --provider searxng asks the instance's JSON API."""
    http_server.search_answer = {"results": [{"title": "T", "url": "https://t.example/"}]}
    url = f"http://127.0.0.1:{http_server.port}"
    assert run(["search", "q", "--provider", "searxng", "--searxng-url", url]) == 0
    assert "1. T\n   https://t.example/\n" in capsys.readouterr().out


def test_search_without_provider_exits_two(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no provider configured, search says how to configure one and exits 2."""
    monkeypatch.delenv("ASTRALVESSEL_SEARXNG_URL", raising=False)
    monkeypatch.delenv("BRAVE_API_KEY", raising=False)
    assert run(["search", "otters"]) == 2
    assert "no search provider configured" in capsys.readouterr().err
