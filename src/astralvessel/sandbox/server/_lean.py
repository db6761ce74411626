"""Stand-ins for the few standard-library helpers the server uses (stdlib only, Python 3.8+).

Every idle turn holds the server's interpreter in memory, and the target is
8 MiB a turn (PSS, every process of it). ``contextlib``, ``selectors``,
``signal`` and ``socket`` would each bring ``enum``, ``functools`` or
``collections`` into the server: about 1.1 MiB of Python objects, resident
once per turn (the zygote and the inits share them copy-on-write). So the
server uses these instead, which behave as the parts of those modules it
needs, on the C modules underneath:

- ``suppress``: ``contextlib.suppress``.
- ``Selector``: ``selectors.EpollSelector`` (``DefaultSelector`` on Linux), its
  ``register``, ``modify``, ``unregister``, ``get_map`` and ``select``.
- ``signal``: the ``_signal`` C module under ``signal``, whose functions take
  and return plain integers (``signal`` only wraps them in enums).

A socket is ``_socket.socket``, the C type ``socket.socket`` derives from.
"""

from __future__ import annotations

import select

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import Any, Protocol

    class _HasFileno(Protocol):
        def fileno(self) -> int: ...

    FileLike = int | _HasFileno
else:
    try:
        import _signal as signal
    except ImportError:  # an interpreter that has no _signal (CPython always has)
        import signal

__all__ = ["EVENT_READ", "EVENT_WRITE", "Key", "Selector", "signal", "suppress"]

EVENT_READ = 1
EVENT_WRITE = 2


class _Suppress:
    def __init__(self, exceptions: tuple[type[BaseException], ...]) -> None:
        self.exceptions = exceptions

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, value: object, traceback: object) -> bool:
        return kind is not None and issubclass(kind, self.exceptions)


def suppress(*exceptions: type[BaseException]) -> _Suppress:
    """A context manager that leaves its block quietly on any of ``exceptions``."""
    return _Suppress(exceptions)


class Key:
    """One registered file: the object given, its descriptor, the events and the caller's data."""

    __slots__ = ("data", "events", "fd", "fileobj")

    def __init__(self, fileobj: FileLike, fd: int, events: int, data: Any) -> None:
        self.fileobj = fileobj
        self.fd = fd
        self.events = events
        self.data = data


def _mask(events: int) -> int:
    if not events or events & ~(EVENT_READ | EVENT_WRITE):
        raise ValueError(f"invalid events: {events!r}")
    return (select.EPOLLIN if events & EVENT_READ else 0) | (
        select.EPOLLOUT if events & EVENT_WRITE else 0
    )


class Selector:
    """An epoll selector with ``selectors``' interface, as far as the server uses it."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._keys: dict[int, Key] = {}

    def _fd(self, fileobj: FileLike) -> int:
        """The descriptor ``fileobj`` was registered under (a closed socket's too, as selectors)."""
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if fd < 0:
            for key in self._keys.values():
                if key.fileobj is fileobj:
                    return key.fd
            raise ValueError(f"invalid file object: {fileobj!r}")
        return fd

    def register(self, fileobj: FileLike, events: int, data: Any = None) -> Key:
        """Watch ``fileobj`` for ``events``; ``KeyError`` if it is watched already."""
        fd = self._fd(fileobj)
        if fd in self._keys:
            raise KeyError(f"{fileobj!r} (fd {fd}) is already registered")
        self._epoll.register(fd, _mask(events))
        key = self._keys[fd] = Key(fileobj, fd, events, data)
        return key

    def unregister(self, fileobj: FileLike) -> Key:
        """Stop watching ``fileobj``; ``KeyError`` if it is not watched."""
        key = self._keys.pop(self._fd(fileobj))
        with suppress(OSError):  # closed already: the kernel dropped it itself
            self._epoll.unregister(key.fd)
        return key

    def modify(self, fileobj: FileLike, events: int, data: Any = None) -> Key:
        """Change what ``fileobj`` is watched for, and its data."""
        key = self._keys[self._fd(fileobj)]
        if events != key.events:
            self._epoll.modify(key.fd, _mask(events))
        key.events = events
        key.data = data
        return key

    def get_map(self) -> dict[int, Key]:
        """Every key, by descriptor (the caller reads it, never changes it)."""
        return self._keys

    def select(self, timeout: float | None = None) -> list[tuple[Key, int]]:
        """Wait at most ``timeout`` seconds (None: for ever); each ready key with its events."""
        if timeout is None:
            wait = -1.0
        elif timeout <= 0:
            wait = 0.0
        else:
            # epoll counts milliseconds: round up, or a deadline wakes the loop just early.
            # (-(-x // 1) is ceil(x): the math module is a shared library to load at every
            # turn start, and resident in every idle turn, for this alone.)
            wait = -(-timeout * 1e3 // 1) * 1e-3
        try:
            ready = self._epoll.poll(wait, max(len(self._keys), 1))
        except InterruptedError:
            return []
        found = []
        for fd, mask in ready:
            events = 0
            # An error or hang-up is news for both directions, as selectors reports it.
            if mask & ~select.EPOLLIN:
                events |= EVENT_WRITE
            if mask & ~select.EPOLLOUT:
                events |= EVENT_READ
            key = self._keys.get(fd)
            if key is not None and events & key.events:
                found.append((key, events & key.events))
        return found

    def close(self) -> None:
        """Close the epoll descriptor and forget every key."""
        self._epoll.close()
        self._keys.clear()

    def __enter__(self) -> Selector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
