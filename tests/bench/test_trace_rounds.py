"""``bench/trace.py --rounds`` finds every hop of a real local round trip: its markers follow
the scripts as they are. When the start script stopped writing ``stats:jobs`` and the end
script stopped naming ``lease:job``, no traced round trip matched and the profile printed
"no round trip had the expected shape" instead of its hops."""

from __future__ import annotations

import re

import pytest
import trio

from bench import trace

ROUNDS = 4


async def test_every_traced_local_round_trip_has_each_hop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with trio.fail_after(120):
        await trace.trace(False, False, ROUNDS)
    out = capsys.readouterr().out
    assert "no round trip had the expected shape" not in out
    traced = re.search(r"^(\d+) local round trips traced", out, re.MULTILINE)
    assert traced is not None, out
    assert int(traced.group(1)) == ROUNDS
    for name, _ in trace.HOPS:
        assert name in out
