"""One exception root for everything cat-edge raises on purpose.

Every error names the thing that is wrong and, where there is one, the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


class CatEdgeError(Exception):
    """Root of all cat-edge errors."""


class WireFormatError(CatEdgeError, ValueError):
    """A message could not be decoded; ``reason`` says why (a short, stable slug + detail)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProfileError(CatEdgeError, ValueError):
    """A cost profile is invalid: the message names the file, the field and what is allowed."""


class UnknownNameError(CatEdgeError, KeyError):
    """A registry lookup failed; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want plain text
        return str(self.args[0]) if self.args else ""


class DataError(CatEdgeError, ValueError):
    """A data file or array could not be read or does not fit the model."""


class TransportError(CatEdgeError):
    """A transport could not connect, publish or subscribe."""


def lookup(registry: Mapping[str, T], name: str, what: str) -> T:
    """Return ``registry[name]`` or raise UnknownNameError listing the valid names."""
    try:
        return registry[name]
    except KeyError:
        valid = ", ".join(sorted(registry))
        raise UnknownNameError(f"unknown {what} {name!r}; valid names: {valid}") from None
