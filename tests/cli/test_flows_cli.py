"""``hero-node flow ...`` as a user runs it: a real node subprocess, real CLI invocations."""

from __future__ import annotations

import json
import re

from tests.cli.test_cli import cli, running_node  # noqa: F401 (fixture)


def write_flow(path, jobs) -> str:
    path.write_text(json.dumps({"name": "demo", "jobs": jobs}))
    return str(path)


def test_flow_submit_wait_status_show(running_node, tmp_path):  # noqa: F811
    home, _proc = running_node
    jobs = [
        {"id": "A", "node": "self", "context": 1, "type": "python", "script": "print(2)"},
        {
            "id": "B",
            "node": "self",
            "context": 1,
            "type": "sh",
            "script": "echo $((HERO_DEP_A_STDOUT * 21))",
            "depends": ["A"],
        },
    ]
    ok = cli(home, "flow", "submit", write_flow(tmp_path / "ok.json", jobs), "--wait")
    assert ok.returncode == 0, ok.stderr
    flow_id = re.search(r"flow (\d+) submitted", ok.stdout).group(1)
    summary = ok.stdout.split("\n\n")[-1]
    assert f"flow {flow_id} (demo): finished" in summary
    assert re.search(r"B\s+A\s+\S+\s+ok finished\s+42", summary)
    status = cli(home, "flow", "status", flow_id)
    assert status.returncode == 0
    assert "finished" in status.stdout
    shown = json.loads(cli(home, "flow", "show", flow_id).stdout)
    assert shown["status"] == "finished"
    assert shown["job_states"]["B"]["status"] == "finished"

    jobs[0]["script"] = "raise SystemExit(3)"
    bad = cli(home, "flow", "submit", write_flow(tmp_path / "bad.json", jobs), "--wait")
    assert bad.returncode == 1
    assert "prerequisite_failed" in bad.stdout

    jobs[0]["depends"] = ["B"]
    cycle = cli(home, "flow", "submit", write_flow(tmp_path / "cycle.json", jobs))
    assert cycle.returncode == 1
    assert "cycle" in cycle.stderr
    assert "A" in cycle.stderr
