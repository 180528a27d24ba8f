"""The hero-node CLI and the testnet as a user runs them: real subprocesses, real signals."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nodeproc import set_node

ROOT = Path(__file__).resolve().parents[2]


def cli(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


@pytest.fixture
def running_node(tmp_path):
    """`hero-node init` + `hero-node run` (embedded Valkey); stopped with SIGTERM by its PID."""
    home = tmp_path / "home"
    init = cli(home, "init", "--listen-port", "0")
    assert init.returncode == 0, init.stderr
    # one slot of each type: no test here runs two jobs at once, and the node reports ready
    # only once every runner process is up (~0.5 s of CPU each; the default is a python
    # slot per core). A 1 s grace period: no test here checks what SIGTERM does to a running
    # job (tests/host/test_shutdown.py does), and the teardown's SIGTERM would wait out a job
    # a test left running (its follower interrupted) for up to the default 10 s
    set_node(home, python=1, sh=1, grace_s=1.0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "--home", str(home), "run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        ready = proc.stdout.readline()
        assert "ready:" in ready, proc.stderr.read() if proc.poll() is not None else ready
        yield home, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_init_writes_private_keys_and_refuses_to_overwrite(tmp_path):
    home = tmp_path / "h"
    first = cli(home, "init", "--name", "n1")
    assert first.returncode == 0
    assert "node id:" in first.stdout
    for name in ("node.key", "actor.key"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600
    again = cli(home, "init")
    assert again.returncode == 1
    assert "already holds a node" in again.stderr


def test_run_refuses_a_key_readable_by_others(tmp_path):
    home = tmp_path / "h"
    assert cli(home, "init").returncode == 0
    (home / "node.key").chmod(0o644)
    run = cli(home, "run", timeout=30)
    assert run.returncode == 1
    assert "chmod 600" in run.stderr


def test_commands_without_a_home_explain_what_to_do(tmp_path):
    result = cli(tmp_path / "nothing", "status")
    assert result.returncode == 1
    assert "hero-node init" in result.stderr


def test_submit_wait_prints_42_and_sigterm_stops_everything(running_node):
    home, proc = running_node
    ok = cli(
        home,
        "job",
        "submit",
        "--to",
        "self",
        "--context",
        "1",
        "--type",
        "python",
        "--script",
        "print(6*7)",
        "--wait",
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "42\n"
    bad = cli(
        home, "job", "submit", "--type", "python", "--script", "raise SystemExit('no')", "--wait"
    )
    assert bad.returncode == 1
    assert "failed" in bad.stderr
    assert "no" in bad.stderr
    status = cli(home, "status")
    assert "context 1:" in status.stdout
    valkey_pid = _child_pids(proc.pid)
    assert valkey_pid, "the embedded valkey-server runs as the node's child"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    for pid in valkey_pid:
        assert not _alive(pid), "embedded valkey-server outlived the node"


def test_the_node_and_its_runners_freeze_their_start_up_heap(running_node):
    # a full collection walks every tracked object: 40-50 ms for a node's ~90,000 after start-up,
    # a pause in which no message moves; frozen, later passes skip them (node/host/heap.py)
    home, proc = running_node
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    log = proc.stderr.read()
    node = [int(n) for n in re.findall(r"start-up heap frozen: (\d+) objects out of", log)]
    runners = [int(n) for n in re.findall(r"\(start-up heap frozen: (\d+) objects\)", log)]
    assert len(node) == 1, log[-2000:]
    assert node[0] > 20_000
    assert runners, log[-2000:]
    assert all(n > 10_000 for n in runners)


def _child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(x) for x in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split()[2] != "Z"


def test_testnet_runs_three_nodes_and_cleans_up(tmp_path):
    result = subprocess.run(
        [sys.executable, "deploy/testnet.py", "--nodes", "3", "--dir", str(tmp_path / "net")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # a clean demo warns of nothing: no dial reaches a node that does not know the dialler yet
    said = result.stdout + result.stderr
    assert "WARNING" not in said, [line for line in said.splitlines() if "WARNING" in line]
    # the jobs are timed once the mesh is up, and it says so
    mesh = result.stdout.index("mesh up: 6 links in ")
    assert mesh < result.stdout.index("from    to")
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("node")]
    table = [(r[0], r[1], r[2], r[3]) for r in rows if len(r) > 4 and r[3] == "finished"]
    assert ("node1", "node2", "python", "finished") in table
    assert ("node1", "node3", "python", "finished") in table
    assert ("node3", "node1", "sh", "finished") in table
    sockets = re.findall(r"unix://node@(\S+/run/valkey\.sock)", result.stdout)
    assert len(sockets) == 3
    consoles = re.findall(r"  node\d: (http://127\.0\.0\.1:\d+)", result.stdout)
    assert len(set(consoles)) == 3  # each node its own web console
    running = subprocess.run(
        ["pgrep", "-af", "valkey-server"], capture_output=True, text=True, check=False
    ).stdout
    for path in sockets:  # each node's embedded valkey-server names its socket in its title
        assert path not in running
