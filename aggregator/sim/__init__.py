"""The simulator: N real agents and the real round engine in one process (``aggregator simulate``).

Nothing is written twice. Every agent is an :class:`edge_agent.agent.loop.Agent` (its own data
shard, cost profile, policy for T, compressor, error feedback and cost ledger) and the
aggregator is a :class:`aggregator.engine.rounds.RoundEngine`; they talk through a fresh in-process
broker (``memory://``) exactly as they would over MQTT, pumped synchronously and
deterministically by one harness.

Modules, in the order a run uses them:

- :mod:`~aggregator.sim.cli`: flags, the paper preset, flags -> report;
- :mod:`~aggregator.sim.methods`: the method grammar (``cat-topk+ef21``, ``topk:64``, ...);
- :mod:`~aggregator.sim.problem`: data, model and ``f*``; the fleet of shards and profiles;
- :mod:`~aggregator.sim.harness`: the engine-plus-agents harness over ``memory://`` (also
  used by tests);
- :mod:`~aggregator.sim.experiment`: one method on one fleet, the per-round trace;
- :mod:`~aggregator.sim.report`: JSON records, the summary table, progress bar, plot;
- :mod:`~aggregator.sim.blas`: OpenBLAS on one thread while simulating (speed only).

The service (app, service, store, settings, metrics, schemas, rounds) never imports this
package, and this package needs none of the service's web dependencies: the simulator runs
with the device path's dependencies plus scipy-free numpy code (matplotlib for ``--plot``).
"""

from __future__ import annotations

__all__: list[str] = []
