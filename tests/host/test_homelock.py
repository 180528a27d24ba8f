"""One node per home: a second `hero-node run` touches nothing; a stopped node is reported so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from node.host.homelock import HomeInUse, hold_home, holder
from node.host.valkey import process_gone
from tests.nodeproc import ROOT, NodeProcess

NOT_RUNNING = "the node is not running (start it with: hero-node run)"
SUBMIT = ("job", "submit", "--to", "self", "--context", "1", "--type", "python")
# the tests' nodes run python jobs one at a time, and every slot is a runner process each
# start waits for (the default is one python slot per core, and two sh slots)
ONE_SLOT = {"python": 1}


async def cli(home: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    with trio.fail_after(timeout_s):
        done = await trio.run_process(
            [sys.executable, "-m", "node.cli", "--home", str(home), *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=ROOT,
        )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def test_the_lock_is_exclusive_and_tells_who_holds_it(tmp_path):
    run_dir = tmp_path / "run"
    assert holder(run_dir) is None
    with hold_home(tmp_path, run_dir):
        assert holder(run_dir) == os.getpid()
        with pytest.raises(
            HomeInUse, match=f"already running on {tmp_path} \\(pid {os.getpid()}\\)"
        ):
            with hold_home(tmp_path, run_dir):
                pass
    assert holder(run_dir) is None  # released with the block


async def test_a_second_run_on_a_running_home_exits_2_and_touches_nothing(tmp_path):
    node = NodeProcess(tmp_path / "home", "first", runners=ONE_SLOT)
    try:
        await node.start()
        assert node.proc is not None
        valkey_pid = int((node.config.valkey_dir / "valkey.pid").read_text())
        second = await cli(node.home, "run")
        assert second.returncode == 2, second.stderr
        assert f"a node is already running on {node.home} (pid {node.proc.pid})" in second.stderr
        # the first node and its Valkey are untouched and keep working
        assert node.proc.returncode is None
        assert not process_gone(valkey_pid)
        assert int((node.config.valkey_dir / "valkey.pid").read_text()) == valkey_pid
        ok = await cli(node.home, *SUBMIT, "--script", "print(6*7)", "--wait")
        assert (ok.returncode, ok.stdout) == (0, "42\n"), ok.stderr
        # however a node dies, its lock goes with it (no child inherits it): a new run starts
        await node.kill()
        await node.start()
        again = await cli(node.home, *SUBMIT, "--script", "print(7)", "--wait")
        assert (again.returncode, again.stdout) == (0, "7\n"), again.stderr
    finally:
        await node.close()


async def test_client_commands_on_a_stopped_node_say_so_at_once(tmp_path):
    node = NodeProcess(tmp_path / "home", "gone", runners=ONE_SLOT)
    try:
        await node.start()
        assert await node.signal_and_wait() == 0
    finally:
        await node.close()
    assert (node.config.run_dir / "node.json").exists()  # what the stopped node left
    for args in (("status",), (*SUBMIT, "--script", "print(1)")):
        start = trio.current_time()
        done = await cli(node.home, *args, timeout_s=30)
        assert done.returncode == 1, done
        assert NOT_RUNNING in done.stderr
        assert "Traceback" not in done.stderr
        assert trio.current_time() - start < 15  # no connection retries: told at once
