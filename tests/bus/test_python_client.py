"""examples/python_client.py, docs/use/client.md's "Python client", run as a program against a
real node (embedded Valkey, connected as the client role, as that page tells a program to)."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from node.host.acl import CLIENT, reachable_url, role_url

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "python_client.py"


async def test_python_client_example_runs_jobs_flows_and_errors(node_factory):
    alice = await node_factory("alice", embedded=True)
    url = role_url(alice.config, reachable_url(alice.config), CLIENT)
    with trio.fail_after(180):
        done = await trio.run_process(
            [sys.executable, str(EXAMPLE), url, str(alice.config.actor_key_path)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=ROOT,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    lines = out.splitlines()
    assert lines[0] == f"node {alice.node_id[:16]}"
    assert "python job finished: 42" in lines
    assert "sh job finished: hello from sh" in lines
    assert (
        "failing job error: exit code 1 (exit code 1) after 2 attempts, stderr: no input" in lines
    )
    assert "flow finished D says: 42 and 7" in lines
    assert lines.index("flow finished: 4/4 jobs over") < lines.index(
        "flow finished D says: 42 and 7"
    )
    assert any(line.startswith("refused: ") and "nowhere" in line for line in lines)
    assert "flow refused: X, Y" in lines
    assert any(line.startswith("still running: no result for message:1:") for line in lines)
    assert lines[-1] == "slow job finished"


def test_readme_shows_the_example_verbatim():
    page = (ROOT / "docs" / "use" / "client.md").read_text()
    section = page.split("# Python client\n", 1)[1].split("\n## ", 1)[0]
    body = EXAMPLE.read_text().split('"""\n\nfrom __future__ import annotations\n', 1)[1]
    assert body.strip() in section
