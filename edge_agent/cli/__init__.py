"""The ``edge-agent`` command line: ``run``, ``calibrate``, ``profiles``, ``data``, ``keys``,
and the log format every process of the project prints (:mod:`edge_agent.cli.logs`).

The console script ``edge-agent`` is :func:`main`; ``python -m edge_agent`` and
``python -m edge_agent.cli`` run it too."""

from edge_agent.cli.commands import main

__all__ = ["main"]
