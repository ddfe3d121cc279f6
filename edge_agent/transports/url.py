"""Transport URLs: ``scheme://[user[:password]@]host[:port][?option=value&...]``.

Query-string options are strings; :class:`OptionReader` converts them (and keyword options
passed in code, which win over the query string) to typed values and rejects unknown names,
so a typo in an option is an error rather than a silently ignored setting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from edge_agent.errors import TransportConfigError

#: One valid URL per scheme, quoted in every URL error.
EXAMPLES: dict[str, str] = {
    "memory": "memory://sim",
    "mqtt": "mqtt://broker.local:1883",
    "mqtts": "mqtts://broker.example.org:8883?ca_file=ca.pem",
    "zmq+tcp": "zmq+tcp://0.0.0.0:5555",
}

#: Ports used when the URL has none. ``zmq+tcp`` has no default: the aggregator binds the
#: URL port *and* port + 1, so the port is always spelled out.
DEFAULT_PORTS: dict[str, int] = {"mqtt": 1883, "mqtts": 8883}


class ParsedUrl(NamedTuple):
    """A transport URL split into its parts; ``options`` holds the query string and userinfo
    (as ``username`` / ``password``)."""

    scheme: str
    host: str
    port: int | None
    options: dict[str, str]


def _url_error(text: str) -> TransportConfigError:
    """A URL that does not parse: configuration (the option is the URL itself)."""
    return TransportConfigError(text, "url")


def _examples() -> str:
    return ", ".join(EXAMPLES.values())


def redact(url: str) -> str:
    """Return ``url`` with any password in the userinfo replaced by ``***`` (for messages)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def parse_url(url: str) -> ParsedUrl:
    """Split a transport URL; raise TransportConfigError (option ``url``) naming the URL and
    showing valid examples.

    The scheme is lower-cased; the host may be empty only for ``memory://`` (broker name
    ``default``). Credentials in the userinfo become the ``username`` / ``password`` options.
    """
    shown = redact(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _url_error(
            f"transport URL {shown!r} is malformed ({exc}); examples: {_examples()}"
        ) from None
    scheme = parts.scheme.lower()
    if not scheme or "://" not in url:
        raise _url_error(
            f"transport URL {shown!r} has no scheme; expected scheme://host:port, "
            f"examples: {_examples()}"
        )
    if parts.path not in ("", "/") or parts.fragment:
        raise _url_error(
            f"transport URL {shown!r} must not have a path or fragment; put options in the "
            f"query string, e.g. {EXAMPLES.get(scheme, EXAMPLES['mqtts'])}"
        )
    host = parts.hostname or ""
    if scheme == "memory":
        host = parts.netloc or "default"
    elif not host:
        raise _url_error(
            f"transport URL {shown!r} has no host; e.g. {EXAMPLES.get(scheme, _examples())}"
        )
    if port is None:
        port = DEFAULT_PORTS.get(scheme)
    options: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        options[key] = value
    if scheme != "memory":
        if parts.username:
            options["username"] = unquote(parts.username)
        if parts.password is not None:
            options["password"] = unquote(parts.password)
    return ParsedUrl(scheme, host, port, options)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class OptionReader:
    """Typed access to a transport's options; :meth:`finish` rejects names nobody read."""

    def __init__(self, url: str, options: Mapping[str, object]) -> None:
        self._url = redact(url)
        self._left = dict(options)
        self._known: list[str] = []

    def _take(self, name: str) -> object | None:
        self._known.append(name)
        return self._left.pop(name, None)

    def _bad(self, name: str, value: object, want: str) -> TransportConfigError:
        return TransportConfigError(f"{self._url}: {{{name}}} must be {want}, got {value!r}", name)

    def get_str(self, name: str, default: str | None = None) -> str | None:
        value = self._take(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._bad(name, value, "a string")
        return value

    def get_float(self, name: str, default: float, *, minimum: float = 0.0) -> float:
        value = self._take(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise self._bad(name, value, "a number")
        try:
            result = float(value)
        except ValueError:
            raise self._bad(name, value, "a number") from None
        if not result >= minimum:
            raise self._bad(name, value, f"a number >= {minimum}")
        return result

    def get_int(self, name: str, default: int, *, minimum: int = 0) -> int:
        value = self._take(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise self._bad(name, value, "an integer")
        try:
            result = int(value)
        except ValueError:
            raise self._bad(name, value, "an integer") from None
        if result < minimum:
            raise self._bad(name, value, f"an integer >= {minimum}")
        return result

    def get_bool(self, name: str, default: bool) -> bool:
        value = self._take(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise self._bad(name, value, "true or false")

    def finish(self, extra_valid: Iterable[str] = ()) -> None:
        """Raise TransportConfigError if any option was not read, listing the valid names."""
        unknown = sorted(set(self._left) - set(extra_valid))
        if unknown:
            valid = ", ".join(sorted({*self._known, *extra_valid}))
            raise TransportConfigError(
                f"{self._url} ({{url}}): unknown option(s) {', '.join(unknown)}; "
                f"valid options: {valid}",
                "url",
            )
