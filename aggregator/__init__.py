"""cat-edge aggregator: the FastAPI service that runs CAT training rounds for a fleet of agents.

Modules: :mod:`~aggregator.service.settings` (configuration), :mod:`~aggregator.engine.rounds` (the pure
round engine), :mod:`~aggregator.service.store` (journal, checkpoints, history),
:mod:`~aggregator.service.ingest` (transports <-> engine <-> store), :mod:`~aggregator.web.app` (HTTP API).
Run it with ``uvicorn aggregator.app:app`` or ``aggregator serve``.
"""

from __future__ import annotations

__all__: list[str] = []
