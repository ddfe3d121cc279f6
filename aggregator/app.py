"""``uvicorn aggregator.app:app``: the service's documented entry point.

The app itself is built in :mod:`aggregator.web.app`; reading ``app`` here builds the service
from the environment on first read (``AGG_*`` variables and ``AGG_CONFIG_FILE``), as there.
"""

from __future__ import annotations

from fastapi import FastAPI

from aggregator.web.app import create_app

__all__ = ["create_app"]  # and ``app``, built on first read


def __getattr__(name: str) -> FastAPI:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from aggregator.web import app as web_app

    built: FastAPI = web_app.app
    globals()["app"] = built
    return built
