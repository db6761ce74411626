"""An allow-listed network: calls reach exactly the listed hosts through the host's egress proxy.

The machine has no internet and webfetch's egress policy refuses loopback, so
the destination is a real HTTP(S) origin on the host's loopback that the
*operator* admits with an ``AllowRule`` (the same seam the web tests use),
and a ``Resolver`` that names it ``pkgs.test``. Nothing here relaxes the
default policy: ``test_loopback_stays_refused_without_the_operators_rule``
shows the same origin refused when the rule is absent.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import shlex
import shutil
import socket
import ssl
import stat
import subprocess
import threading
import tracemalloc
import zipfile
from collections.abc import Iterator, Sequence
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import attrs
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from astralvessel import Agent, Executor, Registry, Turn
from astralvessel._executor._network import start_sandbox
from astralvessel.sandbox import Mount, Policy, Sandbox, SandboxSession
from astralvessel.sandbox._policy import EGRESS_PORT
from astralvessel.web import AllowRule, EgressPolicy, Fetcher
from astralvessel.web._proxy import EgressProxy
from astralvessel.web._proxyhead import ProxyLimits

from ..web.reserved import SAMPLES as RESERVED_V6
from .calls import py, py_json, run
from .conftest import TEST_LIMITS, WORKDIR

HOST = "pkgs.test"
NOTE = "hello from the origin\n"
#: The backends whose image has curl, git and pip: the host's /usr, and Docker's test image
#: (.ci/build-images.sh); docker-exec relays no network.
HOST_TOOLS = ["bubblewrap", "nsjail", "docker"]


class _Quiet(SimpleHTTPRequestHandler):
    """Serves the origin's folder; one page is ``/hello``."""

    def log_message(self, format: str, *args: object) -> None:
        """Keep test output quiet."""


@attrs.frozen
class Origin:
    """The host's stand-in for a public server: plain HTTP and HTTPS on loopback."""

    http_port: int
    https_port: int
    folder: Path
    ca_pem: Path


def _certificate(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(HOST)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem, key_file = folder / "ca.pem", folder / "key.pem"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pem, key_file


def _git_repo(folder: Path) -> None:
    """A bare repository served by dumb HTTP, holding one file."""
    work = folder / "work"
    work.mkdir()
    (work / "README").write_text("served through the egress proxy\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    subprocess.run([*git, "-C", str(work), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "clone", "-q", "--bare", str(work), str(folder / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(folder / "repo.git"), "update-server-info"], check=True)


def _package_index(folder: Path) -> None:
    """A one-package simple index (PEP 503) holding a tiny pure-Python wheel."""
    wheel = folder / "tinypkg-1.0-py3-none-any.whl"
    info = "tinypkg-1.0.dist-info"
    files = {
        "tinypkg/__init__.py": "ANSWER = 'installed through the egress proxy'\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(name, text)
    page = folder / "simple" / "tinypkg"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="../../{wheel.name}">{wheel.name}</a></body></html>'
    )


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Origin]:
    """An HTTP and an HTTPS origin on the host's loopback, serving a page and a git repository."""
    folder = tmp_path_factory.mktemp("origin")
    (folder / "hello").write_text(NOTE)
    _git_repo(folder)
    _package_index(folder)
    pem, key = _certificate(folder)
    handler = partial(_Quiet, directory=str(folder))
    plain = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    secure = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (plain, secure)]
    for thread in threads:
        thread.start()
    try:
        yield Origin(
            http_port=plain.server_address[1],
            https_port=secure.server_address[1],
            folder=folder,
            ca_pem=pem,
        )
    finally:
        for server in (plain, secure):
            server.shutdown()
            server.server_close()


class MapResolver:
    """Fixed DNS answers: pkgs.test and unlisted.test are the origin, private.test is private,
    rN.v6.test is the Nth reserved IPv6 spelling."""

    def resolve(self, host: str, port: int) -> Sequence[str]:
        """Answer from the table, or fail as an unknown name does."""
        answers = {
            HOST: ["127.0.0.1"],
            "unlisted.test": ["127.0.0.1"],
            "private.test": ["10.1.2.3"],
            **{f"r{i}.v6.test": [spelling] for i, spelling in enumerate(RESERVED_V6)},
        }
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers[host]


def _operator_rule(origin: Origin) -> EgressPolicy:
    """The operator's exception that admits the origin's two loopback ports, and nothing else."""
    return EgressPolicy(
        allow=[AllowRule(network="127.0.0.1/32", ports=[origin.http_port, origin.https_port])]
    )


@pytest.fixture
def proxy(origin: Origin) -> Iterator[EgressProxy]:
    """The turn's egress proxy: pkgs.test on the origin's ports, private.test and *.v6.test."""
    allow = [f"{HOST}:{origin.http_port}", f"{HOST}:{origin.https_port}", f"{HOST}:80"]
    allow += [f"private.test:{origin.http_port}", f"*.v6.test:{origin.https_port}"]
    with EgressProxy.start(
        allow,
        egress=_operator_rule(origin),
        resolver=MapResolver(),
        limits=ProxyLimits(head_seconds=2.0),
    ) as egress:
        yield egress


@pytest.fixture
def net_session(
    backend: Sandbox, policy: Policy, proxy: EgressProxy, data_dir: Path, origin: Origin
) -> Iterator[SandboxSession]:
    """A turn whose policy allows the proxy's list; the test CA is readable at /data/ca.pem."""
    shutil.copy(origin.ca_pem, data_dir / "ca.pem")
    (data_dir / "ca.pem").chmod(0o644)
    turn = start_sandbox(backend, attrs.evolve(policy, network_allow=proxy.allow), proxy)
    try:
        yield turn
    finally:
        turn.close()


def _fetch(session: SandboxSession, url: str, **kwargs: str) -> dict[str, object]:
    """Fetch ``url`` with Python's urllib, which follows the proxy variables; status and body."""
    return dict(
        py_json(
            session,
            f"""
            import json, ssl, urllib.request, urllib.error
            https = {url!r}.startswith("https:")
            context = ssl.create_default_context(cafile="/data/ca.pem") if https else None
            try:
                with urllib.request.urlopen({url!r}, timeout=20, context=context) as reply:
                    print(json.dumps({{"status": reply.status, "body": reply.read().decode()}}))
            except urllib.error.HTTPError as error:
                print(json.dumps({{"status": error.code, "body": error.read().decode()}}))
            except OSError as error:
                print(json.dumps({{"status": None, "body": str(error)}}))
            """,
            **kwargs,
        )
    )


def test_without_a_list_calls_get_no_proxy_variables(session):
    """A turn without an allow-list has no proxy variables and nothing listening on the port."""
    result = py_json(
        session,
        f"""
        import json, os, socket
        names = sorted(n for n in os.environ if "proxy" in n.lower())
        try:
            socket.create_connection(("127.0.0.1", {EGRESS_PORT}), timeout=3)
            port = "open"
        except OSError as exc:
            port = type(exc).__name__
        print(json.dumps({{"names": names, "port": port}}))
        """,
    )
    assert result == {"names": [], "port": "ConnectionRefusedError"}


def test_calls_get_the_proxy_variables(net_session):
    """With a list, calls get HTTP(S)_PROXY in both cases pointing at the relay, and NO_PROXY."""
    proxy = f"http://127.0.0.1:{EGRESS_PORT}"
    env = py_json(net_session, "import json, os; print(json.dumps(dict(os.environ)))")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[name] == proxy
    assert env["NO_PROXY"] == "localhost,127.0.0.1,::1"


def test_listed_host_is_reached_over_http(net_session, origin):
    """A call fetches a page from the listed host over plain HTTP through the proxy."""
    result = _fetch(net_session, f"http://{HOST}:{origin.http_port}/hello")
    assert result == {"status": 200, "body": NOTE}


def test_listed_host_is_reached_over_https(net_session, origin):
    """A call fetches a page from the listed host over HTTPS, through a CONNECT tunnel."""
    result = _fetch(net_session, f"https://{HOST}:{origin.https_port}/hello")
    assert result == {"status": 200, "body": NOTE}


def test_unlisted_host_is_refused(net_session, origin):
    """A host not on the list gets 403 naming the list, though it resolves to the same origin."""
    result = _fetch(net_session, f"http://unlisted.test:{origin.http_port}/hello")
    assert result["status"] == 403
    assert "not on this turn's network allow-list" in str(result["body"])


def test_listed_host_on_another_port_is_refused(net_session, origin):
    """CONNECT to a listed host on a port the list does not give is refused with 403."""
    result = _fetch(net_session, f"https://{HOST}:8443/hello")
    assert result["status"] is None  # urllib reports a refused tunnel as an OSError
    assert "403" in str(result["body"])


def test_ip_address_is_refused(net_session, origin):
    """A URL naming an IP address, even the origin's own, is refused: the list names hosts."""
    result = _fetch(net_session, f"http://127.0.0.1:{origin.http_port}/hello")
    # NO_PROXY sends loopback direct, to the sandbox's own empty loopback.
    assert result["status"] is None
    outcome = py(
        net_session,
        f"""
        import socket
        s = socket.create_connection(("127.0.0.1", {EGRESS_PORT}), timeout=10)
        s.sendall(b"GET http://127.0.0.1:{origin.http_port}/hello HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        print(s.recv(4096).decode())
        """,
    )
    assert "HTTP/1.1 403" in outcome.output
    assert "is an IP address" in outcome.output


def test_name_resolving_to_a_private_address_is_refused(net_session, origin):
    """A listed name whose DNS answer is a private address is refused, naming the address."""
    result = _fetch(net_session, f"http://private.test:{origin.http_port}/hello")
    assert result["status"] == 403
    assert "10.1.2.3, which is a private address" in str(result["body"])


def test_direct_connections_still_go_nowhere(net_session, origin):
    """With a list, a call that ignores the proxy still reaches neither the host nor outside."""
    result = py_json(
        net_session,
        f"""
        import json, socket
        seen = []
        for address in [("127.0.0.1", {origin.http_port}), ("1.1.1.1", 80), ("10.0.0.1", 443)]:
            try:
                socket.create_connection(address, timeout=3)
                seen.append("connected")
            except OSError as exc:
                seen.append(type(exc).__name__)
        names = [name for _index, name in socket.if_nameindex()]
        print(json.dumps({{"seen": seen, "names": names}}))
        """,
    )
    assert "connected" not in result["seen"]
    assert result["names"] == ["lo"]


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x02\x00" + b"\x00" * 64 + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: pkgs.test\r\n\r\n",
        b"GET http://pkgs.test/ HTTP/9.9\r\n\r\n",
        b"GET http://" + b"a" * 40000 + b"/ HTTP/1.1\r\n\r\n",
    ],
    ids=["tls-to-plain-port", "origin-form", "bad-version", "huge-line"],
)
def test_absurd_requests_get_a_refusal(net_session, garbage):
    """A request the proxy cannot read gets a 4xx status with a reason, and nothing else."""
    outcome = py(
        net_session,
        f"""
        import socket
        s = socket.create_connection(("127.0.0.1", {EGRESS_PORT}), timeout=10)
        try:
            s.sendall({garbage!r})
        except OSError:
            pass
        reply = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
        print(reply.decode(errors="replace"))
        """,
    )
    status = outcome.output.split("\n", 1)[0]
    assert status.startswith(("HTTP/1.1 400", "HTTP/1.1 431")), outcome.output
    assert "astralvessel egress proxy:" in outcome.output


def test_slow_request_head_is_cut_off(net_session, proxy):
    """A request head that never completes (slowloris) gets 408 once the head's time is up."""
    outcome = py(
        net_session,
        f"""
        import socket, time
        s = socket.create_connection(("127.0.0.1", {EGRESS_PORT}), timeout=20)
        s.sendall(b"GET http://pkgs.test/ HTTP/1.1\\r\\n")
        reply = b""
        while True:
            try:
                s.sendall(b"X-Slow: 1\\r\\n")
            except OSError:
                pass
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
        print(reply.decode(errors="replace"))
        """,
    )
    assert outcome.output.startswith("HTTP/1.1 408"), outcome.output


@pytest.mark.parametrize("backend", HOST_TOOLS, indirect=True)
def test_curl_over_http_and_https(net_session, origin):
    """curl reaches the listed host over HTTP and over HTTPS (CONNECT), trusting the test CA."""
    http = run(net_session, "curl", "-sS", f"http://{HOST}:{origin.http_port}/hello")
    https = run(
        net_session,
        "curl",
        "-sS",
        "--cacert",
        "/data/ca.pem",
        f"https://{HOST}:{origin.https_port}/hello",
    )
    assert (http.exit_code, http.output) == (0, NOTE)
    assert (https.exit_code, https.output) == (0, NOTE)


@pytest.mark.parametrize("backend", HOST_TOOLS, indirect=True)
def test_curl_sees_the_refusal(net_session, origin):
    """curl to an unlisted host shows the proxy's 403 and its reason."""
    outcome = run(net_session, "curl", "-sS", "-i", f"http://unlisted.test:{origin.http_port}/")
    assert outcome.output.startswith("HTTP/1.1 403")
    assert "not on this turn's network allow-list" in outcome.output


@pytest.mark.parametrize("backend", HOST_TOOLS, indirect=True)
def test_git_clones_through_the_proxy(net_session, origin):
    """git clones a repository from the listed host over HTTP through the proxy."""
    outcome = run(
        net_session,
        "sh",
        "-c",
        f"git clone -q http://{HOST}:{origin.http_port}/repo.git /workspace/repo "
        "&& cat /workspace/repo/README",
        timeout=60,
    )
    assert (outcome.exit_code, outcome.output) == (0, "served through the egress proxy\n")


@pytest.mark.parametrize("backend", HOST_TOOLS, indirect=True)
def test_pip_installs_from_an_index_through_the_proxy(net_session, origin):
    """pip installs a package from the listed host's index over HTTPS (CONNECT) and it imports."""
    index = f"https://{HOST}:{origin.https_port}/simple/"
    outcome = run(
        net_session,
        "sh",
        "-c",
        "python3 -m pip install -q --disable-pip-version-check --no-deps --no-cache-dir "
        f"--cert /data/ca.pem --index-url {index} --target /workspace/site tinypkg "
        "&& PYTHONPATH=/workspace/site python3 -c 'import tinypkg; print(tinypkg.ANSWER)'",
        timeout=120,
    )
    assert (outcome.exit_code, outcome.output) == (0, "installed through the egress proxy\n")


def test_proxy_in_a_long_temporary_folder_serves_and_dies_with_its_turn(
    backend, policy, origin, long_tmp
):
    """A host whose temporary folder is far longer than a socket's address (107 bytes) still
    gets a turn through its proxy; closing both leaves no socket, folder or thread behind."""
    proxy = EgressProxy.start(
        [f"{HOST}:{origin.http_port}"], egress=_operator_rule(origin), resolver=MapResolver()
    )
    try:
        # A backend that refuses to start (docker-exec) must not leave the proxy running.
        session = start_sandbox(backend, attrs.evolve(policy, network_allow=proxy.allow), proxy)
        try:
            assert _fetch(session, f"http://{HOST}:{origin.http_port}/hello")["status"] == 200
        finally:
            session.close()
    finally:
        proxy.close()
    assert proxy.folder.parent == long_tmp
    assert not proxy.folder.exists()
    assert not [t for t in threading.enumerate() if t.name == "astralvessel-egress"]


def test_loopback_stays_refused_without_the_operators_rule(backend, policy, origin):
    """Without the operator's AllowRule, the same listed name (on loopback) is refused: 403."""
    with EgressProxy.start([f"{HOST}:{origin.http_port}"], resolver=MapResolver()) as proxy:
        networked = attrs.evolve(policy, network_allow=proxy.allow)
        session = start_sandbox(backend, networked, proxy)
        try:
            result = _fetch(session, f"http://{HOST}:{origin.http_port}/hello")
        finally:
            session.close()
    assert result["status"] == 403
    assert "127.0.0.1, which is a loopback address" in str(result["body"])


def test_ipv6_and_private_literals_are_refused_by_name_rule(net_session):
    """CONNECT to bracketed IPv6 or a private IPv4 literal is refused before any lookup."""
    outcome = py(
        net_session,
        f"""
        import socket
        for target in (b"[::1]:443", b"169.254.169.254:80"):
            s = socket.create_connection(("127.0.0.1", {EGRESS_PORT}), timeout=10)
            s.sendall(b"CONNECT " + target + b" HTTP/1.1\\r\\n\\r\\n")
            print(s.recv(4096).decode().split("\\r\\n")[0])
        """,
    )
    assert outcome.output.splitlines() == ["HTTP/1.1 403 Forbidden", "HTTP/1.1 403 Forbidden"]


def test_names_resolving_to_reserved_ipv6_are_refused(net_session, origin):
    """A listed name whose answer is a reserved IPv6 address, in each spelling (IPv4-translated,
    -mapped and NAT64 loopback among them), gets 403 naming the address: no connection tried."""
    names = [f"r{i}.v6.test:{origin.https_port}" for i in range(len(RESERVED_V6))]
    outcome = py(
        net_session,
        f"""
        import socket
        for name in {names!r}:
            s = socket.create_connection(("127.0.0.1", {EGRESS_PORT}), timeout=10)
            s.sendall(b"CONNECT " + name.encode() + b" HTTP/1.1\\r\\n\\r\\n")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            print(reply.decode().split("\\r\\n")[0], "resolves to" in reply.decode())
        """,
    )
    assert outcome.output.splitlines() == ["HTTP/1.1 403 Forbidden True"] * len(RESERVED_V6)


@pytest.fixture
def net_turn(backend: Sandbox, agent_dir: Path, data_dir: Path, origin: Origin) -> Iterator[Turn]:
    """A turn opened through the public API with a network: pkgs.test (both origin ports),
    private.test (HTTPS port), gone.test (resolves to nothing) and pkgs.test:9 (no rule)."""
    shutil.copy(origin.ca_pem, data_dir / "ca.pem")
    (data_dir / "ca.pem").chmod(0o644)
    allow = [f"{HOST}:{origin.http_port}", f"{HOST}:{origin.https_port}", f"{HOST}:9"]
    allow += [f"private.test:{origin.https_port}", f"gone.test:{origin.https_port}"]
    executor = Executor(
        Registry.for_agent(Agent.load(agent_dir)),
        sandbox=backend,
        mounts=(Mount.from_pair(WORKDIR, data_dir),),
        limits=TEST_LIMITS,
        timeout_seconds=60.0,
        network_allow=allow,
        fetcher=Fetcher(_operator_rule(origin), resolver=MapResolver()),
    )
    with executor, executor.turn() as opened:
        yield opened


#: (client, command with {http}/{https} ports, destination it asks for, words of the reason)
REFUSING_CLIENTS = {
    "curl": (
        "curl -sS --cacert /data/ca.pem https://unlisted.test:{https}/hello",
        "unlisted.test:{https}",
        "is not on this turn's network allow-list",
    ),
    "git": (
        "git clone -q https://private.test:{https}/repo.git /workspace/repo",
        "private.test:{https}",
        "resolves to 10.1.2.3, which is a private address",
    ),
    "pip": (
        "python3 -m pip install -q --disable-pip-version-check --no-cache-dir --retries 0 "
        "--timeout 10 --cert /data/ca.pem --index-url https://gone.test:{https}/simple/ "
        "--target /workspace/site tinypkg",
        "gone.test:{https}",
        "gone.test does not resolve",
    ),
    "urllib": (
        "python3 -c 'import urllib.request as u; u.urlopen(\"http://pkgs.test:9/\", timeout=20)'",
        "pkgs.test:9",
        "resolves to 127.0.0.1, which is a loopback address",
    ),
}


@pytest.mark.parametrize("client", list(REFUSING_CLIENTS))
def test_refusals_reach_the_model(net_turn, origin, client):
    """curl, git, pip and urllib hide the proxy's reply to a refused CONNECT or request; the
    call's result still names each refused destination and the proxy's reason, after the
    command's own output, and the next call's result does not repeat it."""
    command, where, reason = (
        part.format(http=origin.http_port, https=origin.https_port)
        for part in REFUSING_CLIENTS[client]
    )
    result = net_turn.call("bash", {"command": command})
    assert result.is_error
    output, _, notes = result.text.partition("\n[network: ")
    assert output  # the command's own words come first
    assert f"the egress proxy refused {where}" in notes
    assert reason in notes
    again = net_turn.call("bash", {"command": "echo quiet"})
    assert "[network:" not in again.text


def test_a_flood_of_refusals_is_bounded(net_turn):
    """A call that sends hundreds of refused requests, each to another name, leaves the host a
    bounded record (ten destinations and a count), and its result a bounded note."""
    flood = 600
    script = (
        "import socket\n"
        f"for i in range({flood}):\n"
        f"    s = socket.create_connection(('127.0.0.1', {EGRESS_PORT}), timeout=20)\n"
        "    s.sendall(b'CONNECT h%d.flood.test:443 HTTP/1.1\\r\\n\\r\\n' % i)\n"
        "    while s.recv(4096): pass\n"
        "    s.close()\n"
    )
    tracemalloc.start()
    try:
        before = _held_by_the_proxy()
        result = net_turn.call("bash", {"command": f"python3 -c {shlex.quote(script)}"})
        held = _held_by_the_proxy() - before
    finally:
        tracemalloc.stop()
    notes = [line for line in result.text.splitlines() if line.startswith("[network: ")]
    assert len(notes) == 11, result.text
    assert notes[-1] == (
        f"[network: the egress proxy refused {flood - 10} more connections to other destinations]"
    )
    # Kept for every refusal, the reasons would hold about 170 kB (283 bytes each, measured).
    assert held < 64 * 1024, held


def _held_by_the_proxy() -> int:
    """Bytes allocated from the proxy's modules and still held."""
    names = ("*/web/_proxy.py", "*/web/_proxyhead.py", "*/_refusals.py")
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, name) for name in names]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


@attrs.frozen
class Recorder:
    """An origin on loopback that keeps every byte each connection brought, and answers 200."""

    port: int
    seen: list[bytes]


def _record(listener: socket.socket, seen: list[bytes]) -> None:
    """Serve connections until the listener closes, each on a thread of its own."""

    def serve(conn: socket.socket) -> None:
        data = b""
        # Everything the connection brings before it goes quiet for a second: a pipelined
        # or smuggled request the proxy passed on arrives right behind the first.
        conn.settimeout(1.0)
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                data += chunk
        seen.append(data)
        with contextlib.suppress(OSError):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
        conn.close()

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    """The recording origin, for the whole module; each test reads what it saw after it."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []
    thread = threading.Thread(target=_record, args=(listener, seen), daemon=True)
    thread.start()
    try:
        yield Recorder(port=listener.getsockname()[1], seen=seen)
    finally:
        listener.close()


#: Requests a call sends to make the origin serve another virtual host (evil.test) on the
#: listed name's address, and the status line the call must read first.
SMUGGLED = {
    "pipelined": (
        b"GET http://pkgs.test:{port}/a HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        "HTTP/1.1 200 OK",
    ),
    "after-a-length": (
        b"POST http://pkgs.test:{port}/a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
        b"GET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        "HTTP/1.1 200 OK",
    ),
    "after-chunks": (
        b"POST http://pkgs.test:{port}/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\nGET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        "HTTP/1.1 200 OK",
    ),
    "plain-tunnel": (
        b"CONNECT pkgs.test:{port} HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        "HTTP/1.1 200 Connection established",
    ),
}


@pytest.mark.parametrize("case", list(SMUGGLED))
def test_no_request_reaches_the_origin_with_the_calls_host(backend, policy, recorder, case):
    """A second request pipelined, smuggled after a body (length or chunked) or sent in a
    plaintext tunnel never reaches the origin: it sees one request, with the URL's Host."""
    raw, status = SMUGGLED[case]
    raw = raw.replace(b"{port}", str(recorder.port).encode())
    with EgressProxy.start(
        [f"{HOST}:{recorder.port}"],
        egress=EgressPolicy(allow=[AllowRule(network="127.0.0.1/32", ports=[recorder.port])]),
        resolver=MapResolver(),
    ) as proxy:
        networked = attrs.evolve(policy, network_allow=proxy.allow)
        session = start_sandbox(backend, networked, proxy)
        try:
            recorder.seen.clear()
            outcome = py(
                session,
                f"""
                import socket
                s = socket.create_connection(("127.0.0.1", {EGRESS_PORT}), timeout=20)
                s.sendall({raw!r})
                reply = b""
                while chunk := s.recv(65536):
                    reply += chunk
                print(reply.decode(errors="replace"))
                """,
            )
        finally:
            session.close()
    assert outcome.output.startswith(status), outcome.output
    seen = b"".join(recorder.seen)
    assert b"evil.test" not in seen
    assert seen.count(b" HTTP/1.1\r\n") == (0 if case == "plain-tunnel" else 1)
    if case == "plain-tunnel":
        assert "carried no TLS" in outcome.output
    else:
        assert f"Host: {HOST}:{recorder.port}\r\n".encode() in seen


def test_connect_to_port_80_is_refused(net_session):
    """CONNECT to a listed name's port 80 is refused (a tunnel would carry plain HTTP with
    the call's own Host); plain HTTP goes as an absolute URL."""
    outcome = py(
        net_session,
        f"""
        import socket
        s = socket.create_connection(("127.0.0.1", {EGRESS_PORT}), timeout=10)
        s.sendall(b"CONNECT pkgs.test:80 HTTP/1.1\\r\\n\\r\\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
        print(reply.decode())
        """,
    )
    assert outcome.output.startswith("HTTP/1.1 403 Forbidden"), outcome.output
    assert "CONNECT to port 80 is refused" in outcome.output


#: The other local user of the attack: the CI's ordinary user (``.ci/setup.sh``).
OTHER_USER = "vesselci"
_KNOCK = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
try:
    s.connect(sys.argv[1])
except OSError as error:
    print("refused", error.errno)
    raise SystemExit
reply = b""
try:
    s.sendall(sys.argv[2].encode())
    while chunk := s.recv(65536):
        reply += chunk
except OSError as error:
    print("reset", error.errno)
print("reply", repr(reply))
"""


def _knock(user: str, socket_path: Path, request: str) -> str:
    """What ``user`` gets from sending ``request`` to the proxy's socket, from the host."""
    found = subprocess.run(
        ["runuser", "-u", user, "--", "/usr/bin/python3", "-c", _KNOCK, str(socket_path), request],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return found.stdout.strip()


def test_another_local_user_cannot_use_the_turns_proxy(net_session, proxy, origin):
    """Another local user who finds the turn's proxy socket (its path is in /proc/net/unix)
    gets nothing through it: the socket is the sandbox's uid's alone (0600), and a connection
    from any other uid is closed unanswered even where the file's mode would let it in.

    When the host is an ordinary user, the sandbox is that user, so the socket is theirs
    alone; no second ordinary user can run here then, and the mode is what is checked."""
    info = os.stat(proxy.socket_path)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == net_session.peer_uid
    if os.geteuid() != 0:
        assert info.st_uid == os.geteuid()
        return
    request = f"GET http://{HOST}:{origin.http_port}/hello HTTP/1.1\r\n\r\n"
    assert _knock(OTHER_USER, proxy.socket_path, request) == f"refused {errno.EACCES}"
    # Past the file's mode, the peer check still holds.
    os.chmod(proxy.socket_path, 0o666)  # noqa: S103 - the attack's own opening
    # Closed unanswered: an empty reply, or a reset or broken pipe on the way.
    assert _knock(OTHER_USER, proxy.socket_path, request).endswith("reply b''")
    # The turn's own calls still get through.
    assert _fetch(net_session, f"http://{HOST}:{origin.http_port}/hello")["status"] == 200
