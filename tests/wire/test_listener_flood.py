"""The listener holds under a flood of connections that never authenticate (bus/wire/gate.py).

Two `hero-node run` processes, alice and bob, dial each other and exchange python jobs while the
test opens a few hundred connections to alice's listener from ten other loopback addresses
(127.0.0.2-11): half stay idle, half send the start of a websocket upgrade and then a header line
a second (slowloris). Each attacker reconnects after alice closes it, for FLOOD_S seconds.
Alice's caps are set low (MAX_PENDING in total, PER_ADDRESS per address, HANDSHAKE_S deadline)
so that the flood meets all three. Checked: the jobs all complete and no link goes down; alice's
open file descriptors (/proc/<pid>/fd) never exceed her baseline by more than the cap, the
attackers' connections among them never exceed the cap, and alice lets go of every one of
those within the handshake deadline after the flood stops; both refusals are counted in
/metrics. Without the gate (trio-websocket's 60 s connect timeout, no cap) alice's fds grow with
the flood and stay up for a minute.

FLOOD_CONNECTIONS=5000 (an environment variable) runs the same by hand at that size.
"""

from __future__ import annotations

import os
import time
from functools import partial

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from bus.client.api import open_client
from bus.core.models import JobStatus
from crypto import read_key_file
from node.host.valkey import free_port
from tests.console_http import get
from tests.nodeproc import NodeProcess, set_node

pytestmark = pytest.mark.slow

CONNECTIONS = int(os.environ.get("FLOOD_CONNECTIONS", "300"))
SOURCES = [f"127.0.0.{i}" for i in range(2, 12)]
FLOOD_S = 8.0
HANDSHAKE_S = 3.0
MAX_PENDING = 64
PER_ADDRESS = 16
SLACK_FDS = 24  # fds alice may open for herself meanwhile (runner pipes, Valkey connections)
JOBS = 20  # each way
SCRIPT = "import time; time.sleep(0.05); print('ok')"


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _attacker_inodes(pid: int) -> set[str]:
    """Inodes of the TCP sockets in alice's network namespace whose far end is an attacker's
    address (127.0.0.2-11), read from /proc/<pid>/net/tcp (addresses in little-endian hex)."""
    attackers = {f"{int.from_bytes(bytes(map(int, a.split('.'))), 'little'):08X}" for a in SOURCES}
    inodes = set()
    with open(f"/proc/{pid}/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[2].split(":")[0] in attackers:
                inodes.add(fields[9])
    return inodes


def held_from_attackers(pid: int) -> int:
    """How many of alice's fds are connections from an attacker: what the gate must let go of.
    Alice's own fd count also moves with what she opens for herself (runner pipes, Valkey
    connections a busy moment added), which says nothing of the gate."""
    inodes = _attacker_inodes(pid)
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        held += target.startswith("socket:[") and target[8:-1] in inodes
    return held


async def wire(alice: NodeProcess, bob: NodeProcess) -> tuple[str, str]:
    """Each knows and dials the other; each one's actor may run jobs at the other."""
    a_id = read_key_file(alice.config.node_key_path).public_hex
    b_id = read_key_file(bob.config.node_key_path).public_hex
    a_actor = read_key_file(alice.config.actor_key_path).public_hex
    b_actor = read_key_file(bob.config.actor_key_path).public_hex
    async with open_client(alice.redis_url) as ca:
        await ca.add_peer(b_id, bob.ws_url, name="bob")
        await ca.register_actor(2, b_actor)
        await ca.register_context(1, admins=[1], executors=[1, 2])
    async with open_client(bob.redis_url) as cb:
        await cb.add_peer(a_id, alice.ws_url, name="alice")
        await cb.register_actor(1, a_actor)
        await cb.register_context(1, admins=[2], executors=[1, 2])
    return a_id, b_id


async def exchange(origin: NodeProcess, dest_id: str, caller: int, n: int) -> int:
    """Submit ``n`` jobs from ``origin`` to ``dest_id``; return how many finished ok."""
    actor = read_key_file(origin.config.actor_key_path)
    async with open_client(origin.redis_url) as client:
        msgs = [
            await client.submit_job(
                actor, caller, to=dest_id, context_id=1, script_type="python", script=SCRIPT
            )
            for _ in range(n)
        ]
        ok = 0
        for msg in msgs:
            [res] = await client.wait_results(msg, timeout_s=60)
            ok += res.status == JobStatus.FINISHED
            if res.status != JobStatus.FINISHED:
                print("job failed:", res, flush=True)
        return ok


class Flood:
    def __init__(self, port: int) -> None:
        self.port = port
        self.attempts = 0  # connections tried (a refused one may fail in connect already)
        self.opened = 0  # ... and established
        self.longest_s = 0.0  # the longest an attacker's connection stayed open

    async def run(self, done: trio.Event) -> None:
        """A tenth of the attackers come from one address, first: past the per-address cap;
        then the rest from nine others: past the total cap."""
        first = CONNECTIONS // 10
        async with trio.open_nursery() as nursery:
            for i in range(first):
                nursery.start_soon(self.attacker, SOURCES[0], i % 2 == 1)
            await trio.sleep(0.5)
            for i in range(first, CONNECTIONS):
                source = SOURCES[1 + i % (len(SOURCES) - 1)]
                nursery.start_soon(self.attacker, source, i % 2 == 1)
        done.set()

    async def attacker(self, source: str, slowloris: bool) -> None:
        with trio.move_on_after(FLOOD_S):
            while True:
                await self.hold_one(source, slowloris)
                await trio.sleep(0.5)  # then again: the flood keeps its pressure

    async def hold_one(self, source: str, slowloris: bool) -> None:
        sock = trio.socket.socket()
        with sock:
            await sock.bind((source, 0))
            self.attempts += 1
            try:
                await sock.connect(("127.0.0.1", self.port))
            except OSError:
                return
            self.opened += 1
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                if slowloris:
                    nursery.start_soon(self.trickle, sock)
                await self.until_closed(sock)
                nursery.cancel_scope.cancel()
            self.longest_s = max(self.longest_s, trio.current_time() - started)

    @staticmethod
    async def until_closed(sock: trio.socket.SocketType) -> None:
        try:
            while await sock.recv(4096):  # the node's answer, if any; until it closes
                pass
        except OSError:  # reset
            return

    @staticmethod
    async def trickle(sock: trio.socket.SocketType) -> None:
        try:
            await sock.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            for n in range(1000):
                await trio.sleep(1)
                await sock.send(b"X-%d: y\r\n" % n)
        except OSError:
            return


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def value(samples: Samples, metric: str, **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


async def metrics(node: NodeProcess) -> Samples:
    status, _, body = await get(f"http://{node.config.console.listen}/metrics")
    assert status == 200, body
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_a_flood_of_unauthenticated_connections_is_bounded(tmp_path):
    alice = NodeProcess(tmp_path / "alice", "alice", console_listen=f"127.0.0.1:{free_port()}")
    bob = NodeProcess(tmp_path / "bob", "bob", actor_id=2)
    set_node(
        alice.home,
        handshake_timeout_s=HANDSHAKE_S,
        max_pending_links=MAX_PENDING,
        max_pending_links_per_address=PER_ADDRESS,
    )
    try:
        await bob.start()
        await alice.start()
        a_id, b_id = await wire(alice, bob)
        assert alice.proc is not None
        pid = alice.proc.pid
        with trio.fail_after(60):  # the links up and warm: one job each way
            assert await exchange(alice, b_id, 1, 1) == 1
            assert await exchange(bob, a_id, 2, 1) == 1
        baseline = fds(pid)
        links_down_before = alice.log.read_text().count("link down")

        flood, flood_over, peak = Flood(alice.listen_port), trio.Event(), [baseline]
        peak_held = 0
        t0 = time.monotonic()
        async with trio.open_nursery() as nursery:

            async def sample() -> None:
                nonlocal peak_held
                while True:
                    peak[0] = max(peak[0], fds(pid))
                    peak_held = max(peak_held, held_from_attackers(pid))
                    await trio.sleep(0.1)

            nursery.start_soon(sample)
            nursery.start_soon(flood.run, flood_over)
            with trio.fail_after(90):
                done = await exchange(alice, b_id, 1, JOBS) + await exchange(bob, a_id, 2, JOBS)
            jobs_s = time.monotonic() - t0
            with trio.fail_after(FLOOD_S + 60):
                await flood_over.wait()  # FLOOD_S after its start
            nursery.cancel_scope.cancel()
        ended = time.monotonic()
        # every attacker socket is closed now: alice lets go of all of them within the deadline
        with trio.move_on_after(HANDSHAKE_S + 2):
            while held_from_attackers(pid) > 0:  # noqa: ASYNC110 - another process: no event
                await trio.sleep(0.1)
        back_s = time.monotonic() - ended
        held_after = held_from_attackers(pid)
        after = fds(pid)
        m = await metrics(alice)
        refusals = partial(value, m, "hero_link_refusals_total")
        listener_full = refusals(stage="listener", reason="listener_full") or 0
        address_full = refusals(stage="listener", reason="address_full") or 0
        timeouts = refusals(stage="handshake", reason="TooSlowError") or 0
        print(
            f"\nflood: {CONNECTIONS} attackers, {flood.attempts} connections tried in "
            f"{FLOOD_S:.0f} s ({flood.opened} established); alice fds {baseline} before, "
            f"{peak[0]} at most (cap {MAX_PENDING}), {after} {back_s:.1f} s after the flood "
            f"({held_after} of them attackers', {peak_held} at most); "
            f"refused listener_full "
            f"{listener_full:.0f}, address_full {address_full:.0f}; timed out {timeouts:.0f}; "
            f"longest held {flood.longest_s:.1f} s; {done}/{2 * JOBS} jobs in {jobs_s:.1f} s",
            flush=True,
        )
        assert done == 2 * JOBS
        assert 0 < peak_held <= MAX_PENDING + 2  # seen, and bounded (2: accepted, not yet shut)
        assert held_after == 0
        assert after <= baseline + SLACK_FDS
        assert alice.log.read_text().count("link down") == links_down_before
        assert peak[0] <= baseline + MAX_PENDING + SLACK_FDS
        assert listener_full > 0
        assert address_full > 0
        assert value(m, "hero_link_up", peer=b_id, name="bob") == 1
        assert value(m, "hero_link_pending_connections") == 0
    finally:
        for node in (alice, bob):
            await node.close()
