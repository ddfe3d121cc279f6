"""Start the service from the environment, as ``uvicorn aggregator.app:app`` does, or fail in
one line.

uvicorn wraps any exception raised in an app's lifespan in a Starlette traceback and exits
3, which systemd restarts forever. So the app uvicorn loads is built by
:func:`start_from_environment` when uvicorn first reads ``aggregator.web.app.app`` (before it
logs "Started server process"): logging first (:mod:`aggregator.service.logs`), then the settings,
then the service is started. A failure is logged as ONE line naming what to fix and ends the
process (SystemExit) with:

* exit 2 (:data:`EXIT_CONFIG`) for what a person must fix: a setting (``AGG_*``), a cost
  profiles directory (``CAT_EDGE_PROFILES_DIR``) that is missing or empty, a checkpoint or
  history file that cannot be restored, a data directory that cannot be written or that
  another aggregator holds (its lock names the holder). The shipped systemd unit does not
  restart on 2. A transport setting the broker or TLS refuses
  (:class:`~edge_agent.errors.TransportConfigError`: a wrong MQTT user name or password,
  a CA that did not sign the broker's certificate, TLS against a plain listener) is one of
  these too; the line names the ``AGG_*`` variable to fix (:func:`setting_for`).
* exit 1 (:data:`EXIT_RETRY`) for what may heal by itself: a broker or socket that cannot
  connect (:class:`~edge_agent.errors.TransportError`). systemd restarts it with back-off.

Nothing is written to the data directory before the settings are valid: the store is opened
only by :meth:`AggregatorService.start`, after every check here.

A standby (``AGG_STANDBY=true``) that finds the data directory held does not exit: it
logs one INFO line naming the holder and returns a :class:`Started` whose ``standby``
waits for the lock (:class:`Standby`, begun by the app's lifespan, so ``/healthz`` answers
503 ``standby`` meanwhile) and starts the service when the holder is gone. A take-over that
fails ends the process with the same one line and exit code as a failed start.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from aggregator.service.datalock import DataDirInUse, DataDirLock
from aggregator.service.ingest import AggregatorService
from aggregator.service.logs import configure_service, log_options
from aggregator.service.profiles import check_profiles_dir
from aggregator.service.settings import Settings, SettingsError, env_name, load_settings
from aggregator.web.agent_metrics import max_agents_from
from aggregator.web.metrics import AggregatorMetrics
from edge_agent.errors import CatEdgeError, TransportConfigError, TransportError, lookup
from edge_agent.transports import TRANSPORTS, parse_url

log = logging.getLogger("aggregator.web.startup")

EXIT_CONFIG = 2
EXIT_RETRY = 1


class Standby:
    """A service not started yet: :meth:`begin` waits (in a thread) for the data directory's
    lock, starts the service with it and calls ``on_started``; :meth:`cancel` gives up."""

    def __init__(self, service: AggregatorService, holder: str) -> None:
        self.service = service
        self.holder = holder  # who held the lock when this one began to wait
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def waiting(self) -> bool:
        """True until the service has started (or the wait was cancelled)."""
        return self._thread is None or self._thread.is_alive()

    def begin(self, on_started: Callable[[AggregatorService], None]) -> None:
        self._thread = threading.Thread(
            target=self._take_over, args=(on_started,), name="standby", daemon=True
        )
        self._thread.start()

    def _take_over(self, on_started: Callable[[AggregatorService], None]) -> None:
        s = self.service.settings
        lock = DataDirLock.wait(s.data_dir, self._stop, poll_s=s.standby_poll_s)
        if lock is None:
            return
        log.info("standby: AGG_DATA_DIR=%s is free (was %s); taking over", s.data_dir, self.holder)
        try:
            _start(self.service, lock)
        except SystemExit as exc:  # logged in one line already; no thread can end uvicorn
            lock.release()
            logging.shutdown()
            os._exit(exc.code if isinstance(exc.code, int) else EXIT_CONFIG)
        on_started(self.service)

    def cancel(self, timeout_s: float = 10.0) -> None:
        """Stop waiting (a take-over under way finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


@dataclass(frozen=True)
class Started:
    """A service already started, with its settings and the metrics it reports to; or,
    with ``standby``, one that starts when the aggregator holding its data directory ends."""

    settings: Settings
    service: AggregatorService
    metrics: AggregatorMetrics
    standby: Standby | None = None


def exit_code(exc: BaseException) -> int:
    """1 for a transport that cannot connect (it may come back), else 2 (fix the config,
    including a transport setting the broker refuses: :class:`TransportConfigError`)."""
    retry = isinstance(exc, TransportError) and not isinstance(exc, TransportConfigError)
    return EXIT_RETRY if retry else EXIT_CONFIG


#: the setting behind each transport option that is not ``AGG_MQTT_<OPTION>``
_SETTING_OF_OPTION = {
    "url": env_name("transports"),
    "curve_server_secret_file": env_name("zmq_secret_key_file"),
    "curve_agents_dir": env_name("zmq_agents_dir"),
}
#: the transport options set by an ``AGG_MQTT_<OPTION>`` variable
_MQTT_OPTIONS = frozenset({"username", "password_file", "ca_file", "cert_file", "key_file",
                           "tls_insecure"})  # fmt: skip


def setting_for(option: str) -> str:
    """The ``AGG_*`` variable that sets transport option ``option`` (else: where it goes)."""
    if option in _MQTT_OPTIONS:
        return env_name(f"mqtt_{option}")
    return _SETTING_OF_OPTION.get(option, f"option {option} in {env_name('transports')}")


def describe(exc: BaseException) -> str:
    """One line: an OSError names its file; a transport setting its ``AGG_*`` variable;
    anything else its message; newlines folded."""
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
    elif isinstance(exc, TransportConfigError):
        text = exc.naming(setting_for)
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def check_transport_schemes(settings: Settings) -> None:
    """SettingsError naming AGG_TRANSPORTS for a URL whose scheme no transport serves (the
    settings check the URL's shape only; this runs before anything is opened or written)."""
    for url in settings.transports:
        try:
            lookup(TRANSPORTS, parse_url(url).scheme, "transport scheme")
        except CatEdgeError as exc:
            raise SettingsError(f"AGG_TRANSPORTS: {exc}") from None


def fail(exc: BaseException, fix: str = "") -> NoReturn:
    """Log ``exc`` (and ``fix``) as one ERROR line; end the process with :func:`exit_code`."""
    log.error("cannot start: %s%s", describe(exc), f"; {fix}" if fix else "")
    raise SystemExit(exit_code(exc))


def start_from_environment(
    overrides: Mapping[str, Any] | None = None, *, level: str | None = None
) -> Started:
    """Configure logging, read and check the settings, start the service; on any failure
    one log line and SystemExit (see the module docstring for the codes). ``overrides``:
    settings that win over the environment (``aggregator serve`` flags); ``level``: the log
    level instead of ``AGG_LOG_LEVEL``."""
    try:
        fmt, env_level = log_options(os.environ)
    except SettingsError as exc:
        configure_service()
        fail(exc)
    configure_service(fmt, level or env_level)
    try:
        settings = load_settings(**(overrides or {}))
        check_transport_schemes(settings)
        check_profiles_dir()
        metrics = AggregatorMetrics(max_agents=max_agents_from(os.environ))
    except CatEdgeError as exc:
        fail(exc)
    service = AggregatorService(settings, observer=metrics.observe_round)
    try:
        _start(service)
    except DataDirInUse as exc:
        if not settings.standby:
            fail(exc)
        log.info(
            "standby: AGG_DATA_DIR=%s is held by %s; this aggregator takes over when it ends",
            settings.data_dir,
            exc.holder,
        )
        return Started(settings, service, metrics, Standby(service, exc.holder))
    return Started(settings, service, metrics)


def _start(service: AggregatorService, lock: DataDirLock | None = None) -> None:
    """``service.start(lock)``; a failure other than DataDirInUse as :func:`fail`."""
    try:
        service.start(lock)
    except DataDirInUse:
        raise
    except CatEdgeError as exc:
        fail(exc)
    except OSError as exc:  # the store: a data directory it cannot create or write
        fail(exc, f"check AGG_DATA_DIR={service.settings.data_dir} (it must be writable)")
