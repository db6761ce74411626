"""The sandbox's own ``/etc`` for bubblewrap and nsjail: nothing in it names the host.

The host's ``/etc`` says who and where the host is: its hostname and machine id,
its users and their homes, its name servers and hosts, its timezone. A call
gets instead a few synthetic files (``SYNTHETIC``: the same on every host and
every turn) and, bound read-only from the host where they exist, only the
entries common tools need to work (``HOST_ENTRIES``, each with the reason).
Everything else of the host's ``/etc`` is absent.

The synthetic files are written once per content into ``etc-DIGEST`` under a
runtime folder of our own (``/run/astralvessel`` as root) and bound from
there, so mount listings show that neutral path. ``etc_steps`` is pure;
``write_synthetic`` is the only part that touches the system.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping

__all__ = [
    "HOSTNAME",
    "HOST_ENTRIES",
    "SYNTHETIC",
    "etc_dir",
    "runtime_dir",
    "write_synthetic",
]

#: The sandbox's hostname: says where a call runs, names nothing of the host.
HOSTNAME = "sandbox"

#: A machine id shared by every sandbox (systemd's format: 32 hex digits, not all
#: zero), so nothing reading it can tell hosts or turns apart.
MACHINE_ID = hashlib.sha256(b"astralvessel sandbox").hexdigest()[:32]

#: File name to content. The call runs as ``nobody`` (65534) on a root host and as
#: uid 0 of a user namespace otherwise: both have an entry, with the workspace as home.
SYNTHETIC: Mapping[str, str] = {
    "passwd": (
        "root:x:0:0:root:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/workspace:/bin/sh\n"
    ),
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hostname": f"{HOSTNAME}\n",
    "hosts": (
        f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback {HOSTNAME}\n"
    ),
    # No network: no name server to ask (glibc would try 127.0.0.1 and fail fast).
    "resolv.conf": "# the sandbox has no network and no name server\n",
    "nsswitch.conf": (
        "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
        "protocols: files\nservices: files\nethers: files\nrpc: files\n"
    ),
    "machine-id": f"{MACHINE_ID}\n",
}

#: Host entries bound read-only where they exist: each holds no secret and no identity.
HOST_ENTRIES: Mapping[str, str] = {
    "/etc/ld.so.cache": "the dynamic loader's index of the libraries in the bound /usr",
    "/etc/alternatives": "Debian's command links (awk, editor, java ...) point through it",
    "/etc/ssl/certs": "the CA bundle (ca-certificates.crt) and its hashed links",
    "/etc/ssl/openssl.cnf": "OpenSSL's configuration; libssl reads it at start",
    "/etc/pki/tls": "the CA bundle and OpenSSL configuration on Fedora and RHEL",
    "/etc/pki/ca-trust": "the CA bundles Fedora and RHEL extract for every TLS library",
    "/etc/crypto-policies": "Fedora's OpenSSL configuration includes its policy files",
    "/etc/protocols": "protocol names (getprotobyname: Python's socket, curl)",
    "/etc/services": "service names and ports (getservbyname)",
    "/etc/mime.types": "file types by extension (Python's mimetypes, curl, file servers)",
    "/etc/os-release": "the distribution of the bound /usr, which pip and platform read",
}


def etc_dir(runtime: str) -> str:
    """The folder under ``runtime`` holding this version of the synthetic files."""
    digest = hashlib.sha256(repr(sorted(SYNTHETIC.items())).encode()).hexdigest()[:16]
    return os.path.join(runtime, f"etc-{digest}")


def runtime_dir(uid: int) -> str:
    """Where this host user keeps the synthetic files: root's /run, else a private temp folder."""
    if uid == 0:
        return "/run/astralvessel"
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return os.path.join(base, f"astralvessel-{uid}")


def write_synthetic(directory: str) -> None:
    """Make sure ``directory`` holds the synthetic files, written whole, readable by all.

    Idempotent and safe against concurrent writers: each file is written to a
    temporary name and renamed into place. Raises ``OSError`` if the folder
    cannot be made or belongs to another user (who could then choose what
    calls see).
    """
    os.makedirs(directory, mode=0o755, exist_ok=True)
    for folder in (os.path.dirname(directory), directory):
        info = os.lstat(folder)
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise OSError(
                f"{folder} must belong to uid {os.getuid()} and not be group/world-writable"
            )
    for name, content in SYNTHETIC.items():
        path = os.path.join(directory, name)
        data = content.encode()
        try:
            with open(path, "rb") as handle:
                if handle.read() == data:
                    continue
        except OSError:
            pass
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
        try:
            os.write(fd, data)
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.replace(temporary, path)
