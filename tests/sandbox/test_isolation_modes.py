"""The node's isolation mode, as an operator sees it (docs/security/sandbox.md):
``isolation = "none"`` is loud at start, in ``status`` (text and --json), ``/metrics`` and the
console feed; a node that can build no sandbox runs no job and says why in the same places;
``hero-node init`` says what ``auto`` picks here."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import trio

from bus.core import keys
from node.config.console import ConsoleConfig
from tests.cli.test_cli import cli
from tests.nodes import link_to, tick
from tests.observe.test_dlq import hero_node
from tests.observe.test_metrics import scrape, value
from tests.runners.test_runner_procs import runner_processes_of
from tests.runners.test_runners import submit

SERVED = ConsoleConfig(listen="127.0.0.1:0")
# for a node that runs sh jobs only, one at a time: every slot is a process its start waits for
SH_SLOT = {"sh": 1}


async def test_none_is_loud_everywhere_and_lets_a_job_read_the_key(node_factory, caplog):
    caplog.set_level(logging.WARNING, logger="node.sandbox")
    alice = await node_factory("alice", isolation="none", console=SERVED, runners=SH_SLOT)
    assert any("ISOLATION OFF" in r.getMessage() for r in caplog.records)
    # the reason it is loud: a job reads the node's key (the control of
    # tests/sandbox/test_sandbox.py)
    script = f"cat {alice.config.node_key_path}"
    with trio.fail_after(30):
        [res] = await alice.client.wait_results(await submit(alice, "sh", script), 25)
    assert res.ok, res
    assert res.stdout.strip() == alice.config.node_key_path.read_text().strip()
    code, out, err = await hero_node(alice, "status")
    assert code == 0, err
    assert "isolation none" in out
    assert "WARNING: jobs run WITHOUT a sandbox" in out
    code, out, _ = await hero_node(alice, "status", "--json")
    assert json.loads(out)["isolation"] == "none"
    samples, _ = await scrape(alice)
    assert (
        value(samples, "hero_isolation_mode", mode="none", limits="rlimits", cpu_time="process")
        == 1
    )
    info = await alice.store.hgetall(keys.ACTORS_DB, keys.NODE_INFO)
    assert info["isolation"] == "none"  # what the console's feed shows (node/web/feed.py)


async def test_a_node_without_a_usable_bwrap_runs_no_job_and_says_why(node_factory, caplog):
    caplog.set_level(logging.ERROR, logger="node")
    alice = await node_factory(
        "alice", sandbox={"bwrap": "/nonexistent/bwrap", "1": {"network": True}}, console=SERVED
    )
    assert any("bwrap not found" in r.getMessage() for r in caplog.records)
    message = await submit(alice, "sh", "echo ran")
    assert runner_processes_of(alice.config.run_dir) == []  # none was started
    code, out, _ = await hero_node(alice, "status")
    assert "isolation refused" in out
    assert "JOBS DO NOT RUN" in out
    assert "bwrap not found" in out
    code, out, _ = await hero_node(alice, "status", "--json")
    assert json.loads(out)["isolation"] == "refused"
    samples, _ = await scrape(alice)
    assert (
        value(samples, "hero_isolation_mode", mode="refused", limits="rlimits", cpu_time="process")
        == 1
    )
    # its caller is answered at once, with why and what to do, instead of waiting in silence
    with trio.fail_after(10):
        [result] = await alice.client.wait_results(message, 8)
    assert result.reason.startswith("isolation_refused: this node runs no 'sh' job"), result
    assert "bwrap not found" in result.reason
    assert "to run jobs there: point [sandbox] bwrap at a bwrap" in result.reason
    job = await alice.store.hgetall(1, result.job_key)
    assert job["status"] == "error", job
    assert job["reason"].startswith("isolation_refused"), job
    assert await alice.store.call(1, lambda r: r.llen(keys.queue("sh"))) == 0


async def test_a_job_sent_to_a_peer_that_runs_none_comes_back_refused_at_once(node_factory):
    alice = await node_factory("alice", runners=SH_SLOT)  # it runs no job: bob refuses
    bob = await node_factory("bob", sandbox={"bwrap": "/nonexistent/bwrap"})
    await link_to(alice, bob)
    message = await submit(alice, "sh", "echo ran", to=bob.node_id)
    with trio.fail_after(10):
        [result] = await alice.client.wait_results(message, 8)
    assert result.reason.startswith("isolation_refused: this node runs no 'sh' job"), result
    assert "bwrap not found" in result.reason  # bob's own reason, carried back
    copy = await alice.store.hgetall(1, result.job_key)
    assert copy["status"] == "error", copy


async def test_job_wait_on_a_job_queued_before_the_node_lost_its_sandbox_says_so(node_factory):
    """A job queued while its type had no local runner (sh: 0 slots), then the node restarts
    with sh runners but no sandbox: the job stays queued, and `job wait` says why it will not
    run, and what to do, instead of waiting for ever."""
    alice = await node_factory("alice", runners={"python": 1, "sh": 0})
    message = await submit(alice, "sh", "echo late")
    job_key = message.job[0].key
    with trio.fail_after(20):
        while await alice.store.call(1, lambda r: r.llen(keys.queue("sh"))) != 1:
            await tick(alice.store)
    await alice.stopped()
    alice = await node_factory(
        "alice", again=alice, sandbox={"bwrap": "/nonexistent/bwrap"}, runners={"sh": 1}
    )
    with trio.fail_after(20):
        code, out, err = await hero_node(alice, "job", "wait", job_key)
    assert code == 1, (out, err)
    assert f"{job_key} waits in its queue and will not run: this node runs no job: " in err
    assert "to run jobs here: point [sandbox] bwrap at a bwrap" in err
    assert "Traceback" not in err
    job = await alice.store.hgetall(1, job_key)
    assert job["status"] == "dispatched", job  # left queued: it runs once a sandbox can be built


@pytest.mark.skipif(os.geteuid() != 0, reason="auto picks strict only where it may switch users")
def test_init_says_what_auto_picks_here(tmp_path: Path) -> None:
    done = cli(tmp_path / "h", "init")
    assert done.returncode == 0, done.stderr
    assert "isolation:  auto -> strict" in done.stdout
    assert "their own uid" in done.stdout
    [bwrap] = [line for line in done.stdout.splitlines() if line.startswith("  bwrap:      /")]
    assert "(bubblewrap 0." in bwrap  # which binary, its version, where it comes from


async def test_a_limit_ends_the_job_with_its_reason_and_the_next_job_runs(node_factory):
    """Through the node: [limits.1] file_size_mb = 1; a job writing 3 MB to its stdout ends
    error with output_limit (its kept output within max_output_bytes); the next one runs."""
    alice = await node_factory("alice", limits={"1": {"file_size_mb": 1}}, runners=SH_SLOT)
    with trio.fail_after(40):
        [big] = await alice.client.wait_results(
            await submit(alice, "sh", "head -c 3000000 /dev/zero | tr '\\0' x"), 30
        )
        [nxt] = await alice.client.wait_results(await submit(alice, "sh", "echo fine"), 30)
    assert big.status.value == "error", big
    assert big.reason.startswith("output_limit"), big.reason
    assert len(big.stdout) <= alice.config.max_output_bytes
    assert nxt.ok, nxt
    assert nxt.stdout == "fine\n"
