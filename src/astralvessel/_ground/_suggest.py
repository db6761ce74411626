"""The closest valid names to one a user got wrong: "did you mean bubblewrap?"."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "install_extra", "missing_extra", "unknown_name"]


def closest(name: str, known: Iterable[str]) -> list[str]:
    """The known names close enough to ``name`` to be what was meant, closest first."""
    # difflib's ratio over lowercase text: a typo ("bubblewarp"), a case slip ("Docker") or a
    # dropped letter ("nsjal") scores above 0.6; an unrelated word does not.
    by_lower = {k.lower(): k for k in known}
    return [by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=3)]


def unknown_name(what: str, name: str, known: Iterable[str]) -> str:
    """``unknown WHAT 'NAME'; did you mean 'X'? WHATs are A, B, C``, naming the closest ones."""
    names = list(known)
    near = closest(name, names)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ";"
    return f"unknown {what} {name!r}{hint} {what}s are {', '.join(names) or 'none'}"


def install_extra(extra: str) -> str:
    """How to install one of the package's extras, in words that work before it is published.

    ``pip install 'astralvessel[X]'`` names a distribution the package index does not hold
    yet; from the source folder ``pip install '.[X]'`` installs the same extra.
    """
    return (
        f"pip install '.[{extra}]' in astralvessel's source folder "
        f"('astralvessel[{extra}]' where the package is published)"
    )


def missing_extra(what: str, package: str, extra: str) -> ImportError:
    """The error for a part of the library whose extra is not installed: what needs which
    package, and how to install the extra that brings it."""
    return ImportError(f"{what} needs the {package} package: {install_extra(extra)}")
