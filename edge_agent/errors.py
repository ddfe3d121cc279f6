"""One exception root for everything cat-edge raises on purpose.

Every error names the thing that is wrong and, where there is one, the fix.

Exception policy (which exception for what):

- **Caller misuse -> ValueError or TypeError.** Code calling a cat-edge function with an
  argument it documents as invalid (a ``T`` outside [0, d], a gradient that is not 1-D,
  ``randk`` without an ``rng``, an argument of the wrong type) is a bug in that code: raise the
  built-in ``ValueError`` (bad value) or ``TypeError`` (bad type). Nobody catches these
  on purpose; they end as a traceback that points at the call to fix.
- **Bad data from outside -> the CatEdgeError family.** Anything the program reads and
  does not control: bytes off the network, files, configuration, links. The entry points
  catch ``CatEdgeError`` and turn it into one line and exit status 1 (CLIs) or a counted,
  dropped message (the service). Pick the class by where the data came from:

  - :class:`WireFormatError` -- a message received over a transport does not decode
    (the binary wire format, or a JSON hello/control/snapshot message); ``reason`` is
    the stable slug the aggregator counts rejections by.
  - :class:`ProfileError` -- a cost profile file or its values (shape, units, ranges).
  - :class:`DataError` -- a data file (libsvm, npz) that cannot be read, or data and
    model parameters that do not fit together (feature counts, non-finite values).
  - :class:`UnknownNameError` -- a name from a command line, a profile or settings that
    is not in a registry (compressor, model, policy, sharding rule, transport scheme);
    raise it through :func:`lookup`, which lists the valid names.
  - :class:`TransportError` -- a transport URL that does not parse, or a broker/socket
    that cannot connect, publish or subscribe (including unreadable key files).
    Its subclass :class:`TransportConfigError` is a setting that no retry heals (wrong
    credentials, an untrusted CA, TLS against a plain listener, a bad option): the CLIs
    exit 2 on it and name the flag or variable of the option it carries.
  - In the aggregator: ``aggregator.service.settings.SettingsError`` (environment settings) and
    ``aggregator.service.store.CheckpointError`` (a checkpoint or journal that cannot be restored).

  The family members that are also ``ValueError``/``KeyError`` subclass those built-ins so
  that generic ``except ValueError`` handlers keep working; new code catches
  ``CatEdgeError`` (or one subclass), never the built-in.
- **The operating system's own errors pass through.** ``OSError`` (a missing file, a
  permission) is not wrapped; the CLIs report its file name and reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


class TransportConfigError(TransportError):
    """A transport setting is wrong and retrying cannot heal it (exit 2 at the CLIs).

    ``options`` are the transport's own option names to fix (``password_file``, ``ca_file``,
    ``username``, ...; ``url`` for the URL itself). ``text`` is the message with each of them
    written as ``{name}``; ``str()`` fills in "option <name>", and each entry point fills in
    its own spelling (a flag, a variable) with :meth:`naming`.
    """

    def __init__(self, text: str, *options: str) -> None:
        self.text = text
        self.options = options
        super().__init__(self.naming(lambda name: f"option {name}"))

    def naming(self, spell: Callable[[str], str]) -> str:
        """The message with every ``{option}`` replaced by ``spell(option)``."""
        out = self.text
        for name in self.options:
            out = out.replace("{" + name + "}", spell(name))
        return out


def lookup(registry: Mapping[str, T], name: str, what: str) -> T:
    """Return ``registry[name]`` or raise UnknownNameError listing the valid names."""
    try:
        return registry[name]
    except KeyError:
        valid = ", ".join(sorted(registry))
        raise UnknownNameError(f"unknown {what} {name!r}; valid names: {valid}") from None
