"""``edge-agent keys``: make CurveZMQ key pairs (zmq+tcp:// authentication), per-agent
MAC keys (signed updates, docs/wire-format.md section 3.3) and the aggregator's signing
key pair (signed downlinks, section 13); docs/operating.md says where each file goes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def cmd_keys_zmq(args: argparse.Namespace) -> int:
    """Write a CurveZMQ key pair and say where each file goes."""
    from edge_agent.transports.zmq_auth import write_keypair

    name = "server" if args.server else args.agent_id
    public, secret = write_keypair(args.out, name)
    if args.server:
        print(f"aggregator secret key: {secret} (AGG_ZMQ_SECRET_KEY_FILE; keep it on the server)")
        print(f"aggregator public key: {public} (give it to every agent: --zmq-server-key-file)")
    else:
        print(f"agent secret key: {secret} (this device only: --zmq-secret-key-file)")
        print(f"agent public key: {public} (copy it into the aggregator's AGG_ZMQ_AGENTS_DIR)")
    return 0


def cmd_keys_mac(args: argparse.Namespace) -> int:
    """Write a per-agent MAC key (32 random bytes, 0600) and say where it goes."""
    from edge_agent.protocol.mac import write_key

    path = write_key(args.out, args.agent_id)
    print(f"MAC key: {path} (this device: --mac-key-file; a copy in AGG_MAC_KEYS_DIR)")
    return 0


def cmd_keys_signing(args: argparse.Namespace) -> int:
    """Write the aggregator's Ed25519 key pair and say where each file goes."""
    from edge_agent.protocol.signing import write_keypair

    public, secret = write_keypair(args.out, args.name)
    print(f"aggregator signing key: {secret} (AGG_SIGNING_KEY_FILE; keep it on the server)")
    print(f"aggregator public key: {public} (give it to every agent: --aggregator-key)")
    return 0


def add_keys_parser(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    keys = sub.add_parser(
        "keys",
        help="make CurveZMQ key pairs, per-agent MAC keys and the aggregator's signing key",
        formatter_class=fmt,
    )
    ksub = keys.add_subparsers(dest="keys_command", required=True, metavar="{zmq,mac,signing}")
    ks = ksub.add_parser(
        "signing",
        help="write the aggregator's Ed25519 pair: <name>.secret (0600) and <name>.key "
        "(public); signs what it sends to agents (docs/operating.md)",
        formatter_class=fmt,
    )
    ks.add_argument("--out", type=Path, required=True, help="directory to write the pair to")
    ks.add_argument(
        "--name", default="aggregator-signing", help="file name stem (another one to rotate)"
    )
    ks.set_defaults(func=cmd_keys_signing)
    km = ksub.add_parser(
        "mac", help="write <agent-id>.mac (0600): signs updates (docs/operating.md)"
    )
    km.add_argument("--out", type=Path, required=True, help="directory to write the key to")
    km.add_argument("--agent-id", required=True, help="the agent the key belongs to")
    km.set_defaults(func=cmd_keys_mac)
    kz = ksub.add_parser(
        "zmq",
        help="write <name>.key (public, 0644) and <name>.secret (0600); see docs/operating.md",
        formatter_class=fmt,
    )
    kz.add_argument("--out", type=Path, required=True, help="directory to write the key pair to")
    who = kz.add_mutually_exclusive_group(required=True)
    who.add_argument("--agent-id", help="the agent the key is bound to (its file name)")
    who.add_argument(
        "--server", action="store_true", help="the aggregator's pair (server.key, server.secret)"
    )
    kz.set_defaults(func=cmd_keys_zmq)
