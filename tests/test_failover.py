"""A node on a replicated store: Sentinel failover under load, and WAITAOF behind every promise."""

from __future__ import annotations

import pytest
import trio

from bus.client.api import open_client
from crypto import read_key_file
from tests.replicated_rig import replicated_node

pytestmark = pytest.mark.slow


async def test_smoke(tmp_path):
    async with replicated_node(tmp_path) as rig:
        actor = read_key_file(rig.home / "actor.key")
        async with open_client(rig.client_url) as client:
            msg = await client.submit_job(
                actor, 1, to="self", context_id=1, script_type="python", script="print(6*7)"
            )
            with trio.fail_after(30):
                [res] = await client.wait_results(msg, 30)
            print(res)
