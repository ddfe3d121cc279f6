"""FastAPI dependencies, all in one place (Annotated aliases for the routes).

The lifespan puts the settings, the service and the metrics on ``app.state``; routes get
them only through these dependencies.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from aggregator.service.ingest import AggregatorService
from aggregator.service.settings import Settings
from aggregator.web.metrics import AggregatorMetrics


def _state(request: Request, name: str) -> object:
    value = getattr(request.app.state, name, None)
    if value is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the aggregator is not running")
    return value


def get_settings(request: Request) -> Settings:
    value = _state(request, "settings")
    assert isinstance(value, Settings)
    return value


def get_service(request: Request) -> AggregatorService:
    value = _state(request, "service")
    assert isinstance(value, AggregatorService)
    return value


def get_metrics(request: Request) -> AggregatorMetrics:
    value = request.app.state.metrics
    assert isinstance(value, AggregatorMetrics)
    return value


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServiceDep = Annotated[AggregatorService, Depends(get_service)]
MetricsDep = Annotated[AggregatorMetrics, Depends(get_metrics)]

_bearer = HTTPBearer(auto_error=False, description="AGG_API_TOKEN (or AGG_API_TOKEN_FILE)")


def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 without or with a wrong bearer token (constant-time compare); 503 if none is set."""
    expected = settings.token
    if expected is None:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "control API disabled: set AGG_API_TOKEN or AGG_API_TOKEN_FILE",
        )
    given = credentials.credentials if credentials is not None else ""
    if (
        credentials is None
        or credentials.scheme.lower() != "bearer"
        or not hmac.compare_digest(given.encode(), expected.encode())
    ):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing or wrong bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )


ControlAuth = Depends(require_token)
