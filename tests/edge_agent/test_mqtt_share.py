"""The ``share`` option of mqtt:// URLs (shared subscriptions): parsing only, no broker."""

from __future__ import annotations

import pytest

from edge_agent.errors import TransportError
from edge_agent.transports import open_transport


@pytest.mark.parametrize("group", ["", "a/b", "+", "#", "x" * 65])
def test_a_share_group_must_be_one_topic_level(group: str) -> None:
    with pytest.raises(TransportError, match="option share"):
        open_transport(f"mqtt://127.0.0.1:1883?share={group}", role="aggregator", client_id="a")


def test_a_valid_share_group_is_accepted_from_the_url_or_a_keyword() -> None:
    for url, options in (
        ("mqtt://127.0.0.1:1883?share=aggs", {}),
        ("mqtt://127.0.0.1", {"share": "aggs"}),
    ):
        t = open_transport(url, role="aggregator", client_id="a", **options)
        t.close()
