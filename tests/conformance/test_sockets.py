"""Promise: a call opens only IP and netlink-route sockets; every other family is refused."""

from __future__ import annotations

import errno

from .calls import py_json

#: Families a call never needs, each a way past the network namespace or kernel attack
#: surface: vsock (the hypervisor), packet, alg, tipc, rds, bluetooth, can, xdp, unix.
REFUSED_FAMILIES = {"vsock": 40, "packet": 17, "alg": 38, "tipc": 30, "rds": 21}
REFUSED_FAMILIES |= {"bluetooth": 31, "can": 29, "xdp": 44, "unix": 1, "unknown": 45}


def test_other_socket_families_refused(session):
    """socket() with any family but IP and netlink answers EPERM, for stream, datagram and raw."""
    result = py_json(
        session,
        f"""
        import json, socket
        out = {{}}
        for name, family in {REFUSED_FAMILIES!r}.items():
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
                try:
                    socket.socket(family, kind).close()
                    out[f"{{name}}/{{kind}}"] = "created"
                except OSError as exc:
                    out[f"{{name}}/{{kind}}"] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert set(result.values()) == {errno.EPERM}, result


def test_vsock_cannot_reach_the_hypervisor(session):
    """A call cannot bind a vsock port or connect to the host's CID 2 (vsock ignores network namespaces)."""
    result = py_json(
        session,
        """
        import json, socket
        out = {}
        for what in ("listen", "connect"):
            try:
                s = socket.socket(40, socket.SOCK_STREAM)
                if what == "listen":
                    s.bind((0xFFFFFFFF, 5555))
                    s.listen(1)
                else:
                    s.settimeout(3)
                    s.connect((2, 22))
                out[what] = "done"
            except OSError as exc:
                out[what] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert result == {"listen": errno.EPERM, "connect": errno.EPERM}


def test_netlink_only_route(session):
    """Netlink route works (interfaces can be listed); uevent, audit and sock_diag are refused."""
    result = py_json(
        session,
        """
        import json, socket
        out = {"interfaces": [name for _i, name in socket.if_nameindex()]}
        for name, protocol in (("route", 0), ("sock_diag", 4), ("audit", 9), ("uevent", 15)):
            try:
                socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol).close()
                out[name] = "created"
            except OSError as exc:
                out[name] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert result == {
        "interfaces": ["lo"],
        "route": "created",
        "sock_diag": errno.EPERM,
        "audit": errno.EPERM,
        "uevent": errno.EPERM,
    }


def test_loopback_ip_still_works(session):
    """A call may still serve and connect on the sandbox's own loopback over IPv4 and IPv6."""
    result = py_json(
        session,
        """
        import json, socket
        out = {}
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            try:
                server = socket.socket(family, socket.SOCK_STREAM)
                server.bind((host, 0))
                server.listen(1)
                client = socket.create_connection(server.getsockname()[:2], timeout=5)
                peer, _ = server.accept()
                client.sendall(b"ping")
                out[host] = peer.recv(4).decode()
            except OSError as exc:
                out[host] = exc.errno
        print(json.dumps(out))
        """,
    )
    # Some hosts disable IPv6 entirely; then ::1 has no address, never a refusal.
    assert result["127.0.0.1"] == "ping"
    assert result["::1"] in ("ping", errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)


def test_only_unix_socketpairs(session):
    """A call may make nameless unix socket pairs (asyncio needs one) and no other kind."""
    result = py_json(
        session,
        """
        import asyncio, json, socket
        out = {}
        for family in (socket.AF_UNIX, 30):
            try:
                a, b = socket.socketpair(family)
                a.sendall(b"ok")
                out[family] = b.recv(2).decode()
            except OSError as exc:
                out[family] = exc.errno
        out["asyncio"] = asyncio.run(asyncio.sleep(0, result="ran"))
        print(json.dumps(out))
        """,
    )
    assert result == {"1": "ok", "30": errno.EPERM, "asyncio": "ran"}
