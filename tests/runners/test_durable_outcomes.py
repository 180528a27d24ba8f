"""A finished job's outcome outlives the process that holds it (issue 21, item 8).

One `hero-node run` on its own Valkey, command (``sh``) and ``python`` jobs running. Valkey is
stopped (SIGSTOP) while they run; then they finish: their runners ask Valkey to record the
outcome, and wait. Then the node, its runner processes and Valkey are killed (-9: what a
stopped unit or a lost machine does to the whole group), and Valkey and the node are
restarted. Every job must be final with the outcome its one run produced: none run twice,
none ``runner_lost``. On a runner that holds the outcome only in memory while it waits, every
python job here is lost and run again (and every job, where no wrapper writes a command's
exit status).

The order is forced, not timed. Each job connects to a gate the test serves on 127.0.0.1 (a
socket: the jobs' sandbox shows them none of the test's files), says its tag, and ends when
the gate answers, which it does once Valkey is stopped; a run is a connection, so a job run
twice is counted. The processes are killed once every job has closed its connection and its
outcome is on disk, or, on a runner that never puts it there, after a bounded wait (then the
restarted node runs those jobs again, and the test says so).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import trio

from bus.client.api import open_client
from bus.core import keys
from bus.core.envelope import JobResult
from crypto import read_key_file
from node.host.valkey import ValkeyProcess, ValkeySpec, free_port
from tests.nodeproc import NodeProcess
from tests.nodes import until
from tests.runners.test_runner_procs import runner_processes_of

RUNNERS = {"python": 2, "sh": 2}

PY_JOB = """\
import os, socket
tag = os.environ["TAG"]
with socket.create_connection(("127.0.0.1", int(os.environ["GATE_PORT"]))) as s:
    s.sendall(tag.encode() + b"\\n")
    s.recv(16)
print(tag)
"""

# bash for its /dev/tcp (dash has none; bash is on every Debian system)
SH_JOB = """\
bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$GATE_PORT"; echo "$TAG" >&3; read -r go <&3'
echo "$TAG"
"""


class Gate:
    """The jobs' gate: counts each job's runs and ends, and opens once."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.runs: Counter[str] = Counter()
        self.ended = 0
        self.open = trio.Event()
        self.all_started = trio.Event()
        self.all_ended = trio.Event()

    async def serve(self, stream: trio.SocketStream) -> None:
        data = b""
        while not data.endswith(b"\n"):
            chunk = await stream.receive_some(64)
            if not chunk:
                return
            data += chunk
        self.runs[data.decode().strip()] += 1
        if sum(self.runs.values()) >= self.jobs:
            self.all_started.set()
        await self.open.wait()
        await stream.send_all(b"go\n")
        while await stream.receive_some(64):  # until the job's process closed it
            pass
        self.ended += 1
        if self.ended >= self.jobs:
            self.all_ended.set()


def outcome_files(node: NodeProcess) -> list[str]:
    """The outcomes of the node's jobs on disk (node/slot/outcomes.py): the attempts' own
    files, and what the slots' files hold."""
    folder = node.config.run_dir / "outcomes"
    named = {p.name for p in folder.glob("*") if not p.name.endswith(".tmp")}
    for slot in (node.config.run_dir / "outcome-slots").glob("*"):
        with contextlib.suppress(ValueError, OSError):
            named.add(json.loads(slot.read_bytes())["file"])
    return sorted(named)


@pytest.mark.slow
async def test_outcomes_held_while_valkey_is_down_survive_the_node_s_death(tmp_path: Path) -> None:
    spec = ValkeySpec(port=free_port(), data_dir=tmp_path / "v", persist=True)
    valkey = ValkeyProcess(spec)
    node = NodeProcess(tmp_path / "n", "n", redis_url=spec.url, runners=RUNNERS)
    # the gate is a socket on the host: NodeProcess already lets context 1 use the network
    assert node.config.sandbox["1"]["network"] is True
    tags = [f"{t}{i}" for t in ("py", "sh") for i in range(RUNNERS["python"])]
    gate = Gate(len(tags))
    try:
        async with trio.open_nursery() as nursery:
            serve = partial(trio.serve_tcp, gate.serve, 0, host="127.0.0.1")
            [listener] = await nursery.start(serve)
            port = listener.socket.getsockname()[1]
            seen = await _scenario(node, valkey, tags, gate, port)
            nursery.cancel_scope.cancel()
    finally:
        await node.close()
        await trio.to_thread.run_sync(valkey.stop)
    twice = sorted(tag for tag, n in gate.runs.items() if n > 1)
    on_disk = "" if seen.held else " (the outcomes never reached the disk)"
    assert twice == [], f"completed-twice: {twice}{on_disk} (runs: {dict(gate.runs)})"
    attempts = seen.attempts
    lost = [
        r.job_key for r, a in zip(seen.results, attempts, strict=True) if "runner_lost" in str(a)
    ]
    assert lost == [], f"runner_lost: {lost}: {attempts}"
    for tag, result in zip(tags, seen.results, strict=True):
        assert result.ok, f"{tag}: {result.status} {result.result}"
        assert result.stdout == tag + "\n", f"{tag}: {result.result}"
        assert result.result["attempts"] == "1", f"{tag}: {result.result}"
    assert node.log.read_text().count("outcome of attempt 1 adopted") == len(tags)


@dataclass(frozen=True)
class Seen:
    held: bool  # every outcome was on disk before the kill
    results: list[JobResult]
    attempts: list[list[dict[str, object]]]  # each job's attempt records


async def _scenario(
    node: NodeProcess, valkey: ValkeyProcess, tags: list[str], gate: Gate, port: int
) -> Seen:
    """Run the jobs, stop Valkey, let them end, kill everything, restart; what came of it."""
    await trio.to_thread.run_sync(valkey.start)
    async with open_client(valkey.url) as admin:  # a -9 must lose no started attempt
        await admin.store.call(0, lambda r: r.config_set({"appendfsync": "always"}))
    await node.start()
    actor = read_key_file(node.config.actor_key_path)
    async with open_client(valkey.url) as client:
        msgs = [
            await client.submit_job(
                actor,
                1,
                to=node.node_id,
                context_id=1,
                script_type="python" if tag.startswith("py") else "sh",
                script=PY_JOB if tag.startswith("py") else SH_JOB,
                env_vars={"TAG": tag, "GATE_PORT": str(port)},
                retries=1,  # a lost runner would run it again: that is what is counted
            )
            for tag in tags
        ]
    with trio.fail_after(60):
        await gate.all_started.wait()
    os.kill(valkey.pid, signal.SIGSTOP)  # from here on, every call to Valkey hangs
    gate.open.set()
    with trio.fail_after(60):
        await gate.all_ended.wait()
    # each runner now waits for Valkey, holding its job's outcome: until it is on disk (on a
    # runner that keeps it in memory only, never: then after a bounded wait)
    held = await until(lambda: len(outcome_files(node)) >= len(tags), 15)
    runners = runner_processes_of(node.config.run_dir)
    await node.kill()
    for pid in runners:  # the node's unit ends: its runner processes go with it
        os.kill(pid, signal.SIGKILL)
    await trio.to_thread.run_sync(valkey.kill)  # killed while stopped: it answered nothing
    await trio.to_thread.run_sync(valkey.start)
    await node.start()
    async with open_client(valkey.url) as client:
        with trio.fail_after(60):
            results = [(await client.wait_results(m, timeout_s=60))[0] for m in msgs]
        attempts = [
            [json.loads(e) for e in await client.store.lrange(1, keys.attempts(r.job_key))]
            for r in results
        ]
    return Seen(held, results, attempts)
