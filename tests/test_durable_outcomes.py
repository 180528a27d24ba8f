"""A finished job's outcome outlives the process that holds it (issue 21, item 8).

One `hero-node run` on its own Valkey, command (``sh``) and ``python`` jobs running. Valkey is
killed (-9) while they run; then they finish: their runners cannot record the outcome ("cannot
record the outcome yet") and hold it. Then the node is killed (-9) together with its runner
processes (what a stopped unit or container does to the whole group), Valkey and the node are
restarted. Every job must be final with the outcome its one run produced: none run twice, none
``runner_lost``. On a runner that drops the outcome file before the end is in Valkey (or never
writes one for a python job), every job here is lost and run again.

The order is forced, not timed: Valkey is down before the jobs may end (they wait for a gate
file the test creates), and the node is killed only once each runner logged that it holds an
outcome it cannot record.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from bus.client.api import open_client
from bus.core import keys
from crypto import read_key_file
from node.host.valkey import ValkeyProcess, ValkeySpec, free_port
from tests.nodeproc import NodeProcess
from tests.test_runner_procs import runner_processes_of

RUNNERS = {"python": 2, "sh": 2}
HOLDING = "cannot record the outcome yet"

PY_JOB = """\
import os, time
tag = os.environ["TAG"]
with open(os.environ["OUT"], "a") as f:
    f.write("S %s\\n" % tag)
while not os.path.exists(os.environ["GATE"]):
    time.sleep(0.05)
with open(os.environ["OUT"], "a") as f:
    f.write("E %s\\n" % tag)
print(tag)
"""

SH_JOB = """\
echo "S $TAG" >> "$OUT"
while [ ! -e "$GATE" ]; do sleep 0.05; done
echo "E $TAG" >> "$OUT"
echo "$TAG"
"""


async def until(what: str, check: Callable[[], bool], timeout_s: float = 30) -> None:
    """Wait (bounded) for ``check()``: files and logs of other processes, nothing to block on."""
    with trio.move_on_after(timeout_s):
        while not check():  # noqa: ASYNC110
            await trio.sleep(0.05)
        return
    raise AssertionError(f"not within {timeout_s} s: {what}")


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
async def test_outcomes_held_while_valkey_is_down_survive_the_node_s_death(tmp_path: Path) -> None:
    spec = ValkeySpec(port=free_port(), data_dir=tmp_path / "v", persist=True)
    valkey = ValkeyProcess(spec)
    node = NodeProcess(tmp_path / "n", "n", redis_url=spec.url, runners=RUNNERS)
    out, gate = tmp_path / "runs.txt", tmp_path / "gate"
    tags = [f"{t}{i}" for t in ("py", "sh") for i in range(RUNNERS["python"])]
    try:
        await trio.to_thread.run_sync(valkey.start)
        async with open_client(spec.url) as admin:  # a -9 must lose no started attempt
            await admin.store.call(0, lambda r: r.config_set({"appendfsync": "always"}))
        await node.start()
        actor = read_key_file(node.config.actor_key_path)
        async with open_client(spec.url) as client:
            msgs = [
                await client.submit_job(
                    actor,
                    1,
                    to=node.node_id,
                    context_id=1,
                    script_type="python" if tag.startswith("py") else "sh",
                    script=PY_JOB if tag.startswith("py") else SH_JOB,
                    env_vars={"TAG": tag, "OUT": str(out), "GATE": str(gate)},
                    retries=1,  # a lost runner would run it again: that is what is counted
                )
                for tag in tags
            ]
        await until("every job started", lambda: len(lines_of(out)) == len(tags))
        await trio.to_thread.run_sync(valkey.kill)
        gate.touch()
        await until("every job ended", lambda: len(lines_of(out)) == 2 * len(tags))

        await until("every runner holds its outcome", lambda: node_log_holds(node, len(tags)))
        runners = runner_processes_of(node.config.run_dir)
        await node.kill()
        for pid in runners:  # the node's unit ends: its runner processes go with it
            os.kill(pid, signal.SIGKILL)
        await trio.to_thread.run_sync(valkey.start)
        await node.start()
        async with open_client(spec.url) as client:
            with trio.fail_after(60):
                results = [(await client.wait_results(m, timeout_s=60))[0] for m in msgs]
            attempts = [
                [json.loads(e) for e in await client.store.lrange(1, keys.attempts(r.job_key))]
                for r in results
            ]
    finally:
        await node.close()
        await trio.to_thread.run_sync(valkey.stop)
    runs = Counter(line.split()[1] for line in lines_of(out) if line.startswith("S "))
    twice = sorted(tag for tag, n in runs.items() if n > 1)
    assert twice == [], f"completed-twice: {twice} ({lines_of(out)})"
    lost = [r.job_key for r, a in zip(results, attempts, strict=True) if "runner_lost" in str(a)]
    assert lost == [], f"runner_lost: {lost}: {attempts}"
    for tag, result in zip(tags, results, strict=True):
        assert result.ok, f"{tag}: {result.status} {result.result}"
        assert result.stdout == tag + "\n", f"{tag}: {result.result}"
        assert result.result["attempts"] == "1", f"{tag}: {result.result}"
    assert "outcome of attempt 1 adopted" in node.log.read_text()


def node_log_holds(node: NodeProcess, n: int) -> bool:
    """Whether ``n`` different jobs' runners logged that they hold an outcome Valkey refused."""
    held = {
        line.split(HOLDING)[0].rstrip(": ").split()[-1]
        for line in node.log.read_text(errors="replace").splitlines()
        if HOLDING in line
    }
    return len(held) >= n
