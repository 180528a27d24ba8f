"""The CLI on a user's mistakes and habits: no traceback, the usual exit codes, --home anywhere,
--version, a group's help, and help text (with defaults) for every option."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from node.cli.main import build_parser
from node.cli.parsing import walk
from tests.cli.test_cli import ROOT, cli, running_node  # noqa: F401 (fixture)

GROUPS = ["job", "flow", "peer", "actor", "context", "dlq", "msg"]


def bare(*args: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """``hero-node ARGS`` with nothing added (no leading --home)."""
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


def test_a_missing_script_file_is_a_usage_error(tmp_path):
    result = bare("job", "submit", "--file", str(tmp_path / "missing.py"))
    assert result.returncode == 2
    assert "cannot read" in result.stderr
    assert "missing.py" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_closed_pipe_ends_quietly(tmp_path):
    home = tmp_path / "h"
    assert cli(home, "init").returncode == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: EPIPE, every time
    try:
        result = bare("--home", str(home), "id", stdout=write_end)
    finally:
        os.close(write_end)
    assert result.returncode == 141
    assert result.stderr == ""


def test_a_refused_connection_is_one_line_without_the_password(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    home = tmp_path / "h"
    url = f"redis://:s3cret@127.0.0.1:{port}"
    assert cli(home, "init", "--redis", url).returncode == 0
    result = cli(home, "status")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert "s3cret" not in result.stderr
    assert "Traceback" not in result.stderr


def interrupted(
    home, *args: str, after: str = "stderr", sigint_ignored: bool = False
) -> tuple[str, int, str]:
    """Run ``hero-node --home HOME ARGS``, wait for its first line on ``after`` (stdout or
    stderr), send it SIGINT; the first line, the exit code and the rest of its stderr.
    ``sigint_ignored``: started as a shell's background job (``cmd &``) or ``nohup`` start
    it, SIGINT ignored, where Python never raises KeyboardInterrupt."""

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "--home", str(home), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=ignore_sigint if sigint_ignored else None,
    )
    try:
        stream = proc.stdout if after == "stdout" else proc.stderr
        assert stream is not None
        assert proc.stderr is not None
        first = stream.readline()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        return first, code, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_while_waiting_names_the_job_and_exits_130(running_node):  # noqa: F811
    home, _node = running_node
    first, code, rest = interrupted(
        home, "job", "submit", "--script", "import time; time.sleep(3)", "--wait"
    )
    assert first.startswith("waiting for job:"), first
    assert code == 130, rest
    job_key = first.split()[2]
    assert f"hero-node job wait {job_key}" in rest
    assert "Traceback" not in rest


def test_home_is_accepted_after_the_command(tmp_path):
    home = tmp_path / "h"
    init = bare("init", "--home", str(home))
    assert init.returncode == 0, init.stderr
    assert f"hero-node run --home {home}" in init.stdout
    status = bare("status", "--home", str(home))
    assert status.returncode == 1
    assert f"{home}: the node is not running" in status.stderr
    (home / "node.key").chmod(0o644)  # run then stops at once, having read this home
    run = bare("run", "--home", str(home))
    assert run.returncode == 1
    assert "chmod 600" in run.stderr


def test_version_is_the_package_version():
    from importlib.metadata import version

    result = bare("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"hero-node {version('hero-node')}"


@pytest.mark.parametrize("group", GROUPS)
def test_a_group_alone_shows_its_help(group):
    result = bare(group)
    assert result.returncode == 2
    assert f"usage: hero-node {group} " in result.stderr
    assert "Traceback" not in result.stderr
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name in actions[0].choices[group]._subparsers._group_actions[0].choices:  # type: ignore[union-attr]
        assert name in result.stderr


def test_every_option_has_help():
    missing = [
        f"{parser.prog}: {action.dest}"
        for parser in walk(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert missing == []


def test_help_shows_defaults():
    result = bare("job", "submit", "--help")
    assert result.returncode == 0
    assert "(default: 60)" in result.stdout  # --timeout
    assert "(default: python)" in result.stdout  # --type
    assert "(default: False)" not in result.stdout  # a flag's default says nothing


def test_ctrl_c_while_following_a_flow_names_it_and_exits_130(running_node, tmp_path):  # noqa: F811
    home, _node = running_node
    job = {"id": "A", "node": "self", "context": 1, "type": "python"}
    flow = tmp_path / "slow.json"
    flow.write_text(json.dumps({"jobs": [job | {"script": "import time; time.sleep(3)"}]}))
    first, code, rest = interrupted(home, "flow", "submit", str(flow), "--wait")
    assert first.startswith("following flow "), first
    assert code == 130, rest
    flow_id = first.split()[2]
    assert f"hero-node flow status {flow_id} --context 1" in rest
    assert "Traceback" not in rest


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["terminal", "sigint-ignored"])
def test_ctrl_c_while_following_logs_exits_130_without_a_traceback(
    running_node,  # noqa: F811
    sigint_ignored: bool,
):
    """Following a job's output stops on SIGINT as ``--wait`` does, also where the command
    was started with SIGINT ignored (a background job of a script): the job runs 10 s, so
    a follower that did not hear the signal would exit 0 with the job, not 130."""
    home, _node = running_node
    script = "import time; print('started', flush=True); time.sleep(10)"
    job_key = cli(home, "job", "submit", "--script", script).stdout.strip()
    first, code, err = interrupted(
        home, "job", "logs", job_key, "-f", after="stdout", sigint_ignored=sigint_ignored
    )
    assert first == "started\n"  # it follows the running job now
    assert code == 130, err
    assert f"stopped following; {job_key} goes on" in err
    assert "Traceback" not in err


def test_a_node_stopped_by_a_bug_names_the_error_before_its_traceback(
    tmp_path, monkeypatch, capsys
):
    cli_main = sys.modules["node.cli.main"]  # the package's `main` names the function

    def crashed(args: argparse.Namespace) -> int:
        def inner() -> None:
            raise ValueError("the link's frame is not bytes")

        try:
            inner()
        except ValueError as exc:
            raise BaseExceptionGroup("nursery", [RuntimeError("first"), exc]) from None
        return 0

    monkeypatch.setattr(cli_main, "cmd_run", crashed)
    with pytest.raises(BaseExceptionGroup):
        cli_main.main(["run", "--home", str(tmp_path)])
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("hero-node: stopped by an unexpected error, a bug")
    assert lines[0].endswith("RuntimeError: first (its traceback follows)")
    assert "test_cli_edges.py:" in lines[1]
    assert "ValueError: the link's frame is not bytes" in lines[1]
