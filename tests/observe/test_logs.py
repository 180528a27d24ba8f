"""The node's logs: a line per message received, job queued and refusal (with its reason),
JSON lines for log shippers, no library noise at INFO, and a failed link's reason."""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from bus import open_client
from bus.core import keys
from bus.store import CLIENT_LOGGER
from bus.wire.transport import Transport
from crypto import KeyPair, read_key_file
from node.config import NodeConfig
from node.host.acl import NODE, role_url
from node.host.home import init_home
from node.host.launch import Ready, parse_ready_line
from node.host.valkey import free_port
from node.observe.logs import CHATTY, configure
from tests.nodes import link_to

ROOT = Path(__file__).resolve().parents[2]


class Lines(logging.Handler):
    """Records as they are emitted; :meth:`wait_for` wakes on each one (no polling)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self._emitted = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self._emitted.set()

    async def wait_for(self, want: Callable[[logging.LogRecord], bool]) -> logging.LogRecord:
        while True:
            self._emitted = trio.Event()
            found = [r for r in self.records if want(r)]
            if found:
                return found[0]
            await self._emitted.wait()


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("bus.wire.transport")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)


@pytest.fixture
def root_logging() -> Iterator[None]:
    """configure() replaces the root logger's handlers: give pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    chatty = {name: logging.getLogger(name).level for name in CHATTY}
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, was in chatty.items():
        logging.getLogger(name).setLevel(was)


async def _ignore(*_: object) -> None:
    return None


async def test_a_failed_link_logs_its_reason(nursery, lines):
    alice = Transport(KeyPair.generate(), set, _ignore, _ignore)
    bob = Transport(KeyPair.generate(), lambda: {alice.node_id}, _ignore, _ignore)
    carol = Transport(KeyPair.generate(), set, _ignore, _ignore)  # unknown to bob
    port = await nursery.start(bob.serve, "127.0.0.1", 0)
    down, wrong = "ab" * 32, "cd" * 32
    nursery.start_soon(alice.dial_forever, down, f"ws://127.0.0.1:{free_port()}")
    nursery.start_soon(alice.dial_forever, wrong, f"ws://127.0.0.1:{port}")  # bob answers
    nursery.start_soon(carol.dial_forever, bob.node_id, f"ws://127.0.0.1:{port}")

    def failed(peer: str) -> Callable[[logging.LogRecord], bool]:
        return lambda r: r.getMessage().startswith(f"link to {peer[:16]}") and "failed" in r.msg

    with trio.fail_after(20):
        peer_down = (await lines.wait_for(failed(down))).getMessage()
        wrong_id = (await lines.wait_for(failed(wrong))).getMessage()
        unknown = (await lines.wait_for(failed(bob.node_id))).getMessage()
    assert "Connection refused" in peer_down
    assert "unexpected_node: dialled cdcdcdcdcdcdcdcd" in wrong_id
    # bob says why he closed the link: alice's log names his reason
    assert "handshake refused: unknown_node" in unknown


async def test_json_lines_name_the_job_the_message_and_the_reason(node_factory, root_logging):
    out = io.StringIO()
    configure("info", "json", out)
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    actor = await link_to(alice, bob)
    with trio.fail_after(30):
        ok = await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print(1)"
        )
        forged = await alice.client.submit_job(
            KeyPair.generate(), 1, to="self", context_id=1, script_type="sh", script="true"
        )
        for message in (ok, forged):
            await alice.client.wait_results(message, 25)
        # an entry naming no hash, then a job behind it: refused alone, the job runs
        await bob.store.lpush(1, keys.MSG_IN, "message:1:404")
        behind = await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="sh", script="true"
        )
        await alice.client.wait_results(behind, 25)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)
    [received] = [r for r in records if r.get("message_key") == ok.key and "received" in r["msg"]]
    assert received["peer"] == alice.node_id
    assert received["ctx"] == 1
    [queued] = [r for r in records if r.get("job") == ok.job[0].key]
    assert queued["msg"].startswith(f"job {ok.job[0].key} (python) queued on queue:python")
    assert queued["logger"] == "node.intake.admission"
    [refused] = [r for r in records if r.get("message_key") == forged.key]
    assert refused["level"] == "warning"
    assert refused["reason"] == "wrong_signer"
    [hostile] = [r for r in records if r.get("reason") == "missing_hash"]
    assert (hostile["ctx"], hostile["level"]) == (1, "warning")
    assert "message:1:404" in hostile["msg"]
    assert "No matching script" not in out.getvalue()  # coredis at INFO: hidden


async def test_store_client_noise_shows_at_debug_only(node_factory, root_logging):
    """The store's client logs each retry at INFO (its own business): shown at debug only,
    while the node's lines show at info."""
    retry = "Retry attempt 1 due to error: No matching script"
    out = io.StringIO()
    configure("debug", "text", out)
    logging.getLogger(CLIENT_LOGGER).info(retry)
    assert retry in out.getvalue()
    out = io.StringIO()
    configure("info", "text", out)
    logging.getLogger(CLIENT_LOGGER).info(retry)
    await node_factory("bob")
    assert "serving context 1" in out.getvalue()
    assert retry not in out.getvalue()


async def _cut_connection_attempt() -> None:
    """What the store's client logs when a cancellation cuts a connection being made."""
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled:
            logging.getLogger(CLIENT_LOGGER).exception("Connection attempt failed unexpectedly!")
            raise


async def test_a_cut_connection_attempt_shows_no_traceback_but_at_debug(root_logging):
    """A node stopping (or failing to start) while its store's client makes a connection:
    the client logs an ERROR with the Cancelled's traceback, which is no error. Other errors
    of the client still show."""
    out = io.StringIO()
    configure("info", "text", out)
    await _cut_connection_attempt()
    logging.getLogger(CLIENT_LOGGER).error("Connection closed unexpectedly!")
    assert "Connection attempt failed" not in out.getvalue()
    assert "Traceback" not in out.getvalue()
    assert "Connection closed unexpectedly!" in out.getvalue()
    out = io.StringIO()
    configure("debug", "text", out)
    await _cut_connection_attempt()
    assert "Connection attempt failed unexpectedly!" in out.getvalue()
    assert "trio.Cancelled" in out.getvalue()


async def test_run_log_format_json_prints_one_object_per_line(tmp_path):
    """Every line of a real node's stderr is one JSON object: the node's own lines and those
    of its runner processes, whose job lines carry the job, its context and how it ended."""
    home = tmp_path / "home"
    config = init_home(home, name="solo", listen_port=0)
    command = [sys.executable, "-m", "node.cli", "--home", str(home), "run", "--log-format", "json"]
    log = tmp_path / "stderr"
    with log.open("wb") as stderr:  # noqa: ASYNC230 - a local file, opened once
        proc = await trio.lowlevel.open_process(
            command, stdout=subprocess.PIPE, stderr=stderr, cwd=ROOT
        )
    assert proc.stdout is not None
    try:
        with trio.fail_after(60):
            ready = b""
            while b"\n" not in ready:
                chunk = await proc.stdout.receive_some()
                assert chunk, "the node exited before its ready line"
                ready += chunk
            jobs = await _run_two_jobs(config, parse_ready_line(ready.decode()))
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
    finally:
        with trio.CancelScope(shield=True):
            proc.kill()
            await proc.wait()
    assert b"ready: id" in ready
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(r["msg"].startswith("node solo (") and " up: " in r["msg"] for r in records)
    assert {r["logger"] for r in records} >= {"node.daemon", "hero-node", "node.worker.loop"}
    assert all(r["ts"].endswith("+00:00") for r in records)
    ok, failed = ({r["msg"].split()[1]: r for r in records if r.get("job") == key} for key in jobs)
    assert ok["started"]["ctx"] == 1
    assert ok["started"]["attempt"] == 1
    assert ok["started"]["runner"].startswith("python:")
    assert ok["finished"]["status"] == "finished"
    assert isinstance(ok["finished"]["duration_ms"], float)
    assert (failed["failed"]["status"], failed["failed"]["reason"]) == ("error", "exit code 3")
    assert failed["failed"]["runner"].startswith("sh:")
    assert failed["failed"]["level"] == "info"


async def _run_two_jobs(config: NodeConfig, ready: Ready) -> tuple[str, str]:
    """A python job that finishes and an sh job that fails, run by the node of ``config``;
    their job keys."""
    actor = read_key_file(config.actor_key_path)
    url = role_url(config, ready.redis_url, NODE)
    async with open_client(url) as client:
        keys_of = []
        for script_type, script in (("python", "print(1)"), ("sh", "exit 3")):
            message = await client.submit_job(
                actor, 1, to=ready.node_id, context_id=1, script_type=script_type, script=script
            )
            [result] = await client.wait_results(message, timeout_s=30)
            assert result.ok == (script_type == "python")
            keys_of.append(message.job[0].key)
    return keys_of[0], keys_of[1]
