"""cat-edge aggregator: the FastAPI service that runs CAT training rounds for a fleet of agents.

Modules: :mod:`~aggregator.settings` (configuration), :mod:`~aggregator.rounds` (the pure
round engine), :mod:`~aggregator.store` (journal, checkpoints, history),
:mod:`~aggregator.service` (transports <-> engine <-> store), :mod:`~aggregator.app` (HTTP API).
Run it with ``uvicorn aggregator.app:app`` or ``aggregator serve``.
"""

from __future__ import annotations

__all__: list[str] = []
