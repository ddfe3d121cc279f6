"""The service's configuration error, apart from the settings so every module that checks
a setting (the settings themselves, the cost profiles directory) can raise it."""

from __future__ import annotations

from edge_agent.errors import CatEdgeError


class SettingsError(CatEdgeError, ValueError):
    """Invalid configuration; the message names the environment variable(s) to fix."""
