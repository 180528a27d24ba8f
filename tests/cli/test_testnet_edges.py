"""deploy/testnet.py where it cannot succeed (issue 45): it says why in one line (two where there
is a fix to give), exits 1, never prints a traceback, sends no job it knows will not run, and
leaves nothing running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.bare import namespaces_refused

ROOT = Path(__file__).resolve().parents[2]


def run_testnet(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "deploy/testnet.py", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.slow
def test_where_no_sandbox_can_be_built_it_stops_at_the_first_node_with_the_fix(tmp_path):
    net = tmp_path / "net"
    done = run_testnet("--nodes", "3", "--dir", str(net), prefix=tuple(namespaces_refused()))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if not line[:4].isdigit()]  # not logs
    assert said[0].startswith("testnet: node1 runs no job: no sandbox can be built"), said
    assert said[1].startswith("  to run jobs on this machine: namespaces are refused by a seccomp")
    assert len(said) == 2, said
    assert not (net / "node2").exists()  # stopped at the first node
    assert "from    to" not in done.stdout  # no job was sent
    running = subprocess.run(
        ["pgrep", "-af", "valkey-server"], capture_output=True, text=True, check=False
    ).stdout
    assert str(net / "node1") not in running


def test_any_failure_is_one_line_and_exit_1(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    done = run_testnet("--nodes", "2", "--dir", str(a_file))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"testnet: FileExistsError: [Errno 17] File exists: '{a_file}'"
    ]
