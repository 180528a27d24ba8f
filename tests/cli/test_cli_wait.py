"""``job submit --wait`` and ``job wait``: the job's output live, its own exit code."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.cli.test_cli import ROOT, cli, running_node  # noqa: F401 (fixture)

SLOW = "echo first; sleep 2; echo second >&2; echo third; exit 4"


def test_wait_streams_output_live_and_exits_with_the_scripts_code(running_node):  # noqa: F811
    home, _node = running_node
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "node.cli",
            "--home",
            str(home),
            "job",
            "submit",
            "--type",
            "sh",
            "--script",
            SLOW,
            "--wait",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        first_at = time.monotonic()
        rest, err = proc.communicate(timeout=60)
        ended_at = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first == "first\n"
    # printed while the script slept, not with its result: the rest came >= ~2 s later
    assert ended_at - first_at > 1.0, (first_at - started, ended_at - started)
    assert rest == "third\n"
    assert "second\n" in err
    assert proc.returncode == 4, err
    assert "failed: exit code 4" in err


def test_a_python_scripts_exit_code_is_the_commands(running_node):  # noqa: F811
    home, _node = running_node
    result = cli(home, "job", "submit", "--script", "import sys; print('x'); sys.exit(5)", "--wait")
    assert result.stdout == "x\n"
    assert result.returncode == 5
    ok = cli(home, "job", "submit", "--script", "print(6*7)", "--wait")
    assert (ok.returncode, ok.stdout) == (0, "42\n")


def test_job_wait_reattaches_and_exits_with_the_jobs_code(running_node):  # noqa: F811
    home, _node = running_node
    submitted = cli(home, "job", "submit", "--type", "sh", "--script", "echo a; sleep 1; exit 3")
    assert submitted.returncode == 0, submitted.stderr
    job_key = submitted.stdout.strip()
    waited = cli(home, "job", "wait", job_key)
    assert waited.stdout == "a\n"
    assert waited.returncode == 3, waited.stderr
    again = cli(home, "job", "wait", job_key)  # over already: the same answer at once
    assert (again.returncode, again.stdout) == (3, "a\n")
    missing = cli(home, "job", "wait", "job:1:12345")
    assert missing.returncode == 1
    assert "no job:1:12345 in context 1" in missing.stderr


def test_progress_shows_status_and_elapsed_on_a_terminal_only(capsys):
    from node.cli.submit import Progress

    shown = Progress("job:1:2", tty=True, started=time.monotonic() - 12.2)
    shown.show("started")
    shown.clear()
    shown.clear()  # nothing left to clear
    assert capsys.readouterr().err == "\r\x1b[Kjob:1:2: started, 12 s\r\x1b[K"
    piped = Progress("job:1:2", tty=False)
    piped.show("started")
    piped.clear()
    assert capsys.readouterr().err == ""
