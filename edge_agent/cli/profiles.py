"""``edge-agent profiles``: the shipped (or given) cost profiles, and the T CAT would pick
on each for a gradient (a synthetic heavy-tailed one, or ``--gradient``)."""

from __future__ import annotations

import argparse
import json

import numpy as np


def cmd_profiles(args: argparse.Namespace) -> int:
    from edge_agent.links.catalog import list_profiles, resolve_profile
    from edge_agent.numerics.selection import make_price, select
    from edge_agent.protocol.wire import encoded_size

    profiles = (
        [resolve_profile(p) for p in args.profile] if args.profile else list_profiles(args.dir)
    )
    if args.gradient:
        g = np.load(args.gradient).astype(np.float64).ravel()
    else:
        rng = np.random.default_rng(args.seed)
        g = rng.standard_normal(args.d) * rng.pareto(1.5, args.d)
    d = g.size
    rows = []
    for p in profiles:
        price = make_price(p, args.compressor, d=d, job="job", agent="agent")
        sel = select(g, args.compressor, price) if args.compressor != "dense" else None
        t = sel.t if sel else d
        size = int(
            encoded_size(args.compressor, d=d, t=t, job="job", agent="agent", round=0, seq=0)
        )
        dense_size = int(encoded_size("dense", d=d, t=d, job="job", agent="agent", round=0, seq=0))
        c, dc = p.message_cost(size), p.message_cost(dense_size)
        objective = p.objective
        # receiving the dense model once (what a dense broadcast costs this device), and the
        # network's daily downlink cap (None: no cap); a profile without a downlink part is symmetric
        down_dense = p.downlink_cost(dense_size)
        rows.append(
            {
                "profile": p.name,
                "kind": p.kind,
                "objective": objective,
                "max_payload_bytes": p.max_payload_bytes,
                "duty_cycle": p.duty_cycle,
                "duty_cycle_bands": p.duty_cycle_bands,
                "t": t,
                "size_bytes": size,
                "packets": c.packets,
                "airtime_s": c.airtime_s,
                "energy_j": c.energy_j,
                "silence_s": c.silence_s,
                "dense_size_bytes": dense_size,
                "cost_vs_dense": getattr(c, objective if objective != "packets" else "packets")
                / max(getattr(dc, objective if objective != "packets" else "packets"), 1e-300),
                "downlink_dense_cost": getattr(down_dense.cost, objective),
                "downlink_dense_packets": down_dense.packets,
                "max_downlinks_per_day": p.max_downlinks_per_day,
            }
        )
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(
        f"CAT choice for d={d} ({args.compressor}, {'gradient ' + args.gradient if args.gradient else 'synthetic heavy-tailed gradient'}):"
    )
    head = (
        f"{'profile':<36} {'objective':<10} {'T*':>7} {'bytes':>8} {'pkts':>5} {'airtime_s':>10} "
        f"{'energy_j':>10} {'vs dense':>9} {'down dense':>10} {'down/day':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        cap = r["max_downlinks_per_day"]
        print(
            f"{r['profile']:<36} {r['objective']:<10} {r['t']:>7} {r['size_bytes']:>8} {r['packets']:>5} "
            f"{r['airtime_s']:>10.4g} {r['energy_j']:>10.4g} {r['cost_vs_dense']:>9.2e} "
            f"{r['downlink_dense_cost']:>10.4g} {'-' if cap is None else cap:>8}"
        )
    print(
        "down dense: receiving one dense model message, in the objective's unit; "
        "down/day: the network's downlink cap per day (-: none)"
    )
    return 0
