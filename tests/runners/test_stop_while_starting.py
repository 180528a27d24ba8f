"""A node stopped while a new context's runner processes are still being started (issue 45:
the testnet stops its nodes whenever it fails, often seconds after it registered its context)
stops cleanly: exit 0, no "stopped by an unexpected error" and its traceback.

The runners of a context registered while the node runs start in two stages (each type's
first slot, then the others: node/runners/processes.py start_stages); a slot of the second
stage, reached after SIGTERM began the graceful stop, returned without reporting started, and
its starter took that for a crash."""

from __future__ import annotations

import signal

import pytest
import trio

from bus.client.api import open_client
from node.host.home import init_home
from node.host.launch import start_node_process
from node.host.valkey import stop_stale
from tests.nodes import until_read

pytestmark = pytest.mark.slow


async def test_sigterm_during_a_new_contexts_staged_runner_start_exits_0(tmp_path):
    home = tmp_path / "h"
    config = init_home(home, listen_port=0, console_listen="", runners={"python": 3, "sh": 3})
    err = home / "node.err"
    with err.open("wb") as errf:  # noqa: ASYNC230 - a local file, opened once
        proc, ready = await start_node_process(home, log_level="warning", stderr=errf)
    try:
        assert proc.stdout is not None
        async with open_client(ready.redis_url) as client:
            await client.register_context(2, admins=[1])

            async def runners_registered() -> bool:  # just before its runners start, in stages
                return bool(await client.store.call(2, lambda r: r.keys("runner:*")))

            assert await until_read(runners_registered, 20)
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(60):
            code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        stop_stale(config.valkey_dir)
    said = err.read_text()
    assert "stopped by an unexpected error" not in said, said[-3000:]
    assert code == 0, said[-3000:]
