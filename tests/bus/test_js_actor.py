"""The JavaScript reference actor (examples/js, written from PROTOCOL.md) against the vectors and
a real node: `hero-node run` with its embedded Valkey, the actor registered with the CLI, the
job submitted by the JavaScript program through the URL of `hero-node credentials client`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ACTOR = ROOT / "examples" / "js" / "hero-actor.mjs"
NODE_JS = shutil.which("node")

pytestmark = pytest.mark.skipif(
    NODE_JS is None,
    reason="Node.js is not installed (no `node` on PATH): the JavaScript reference actor "
    "in examples/js cannot run here; install nodejs to run it",
)


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


def js(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert NODE_JS is not None
    return subprocess.run(
        [NODE_JS, str(ACTOR), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
        env={**os.environ, **(env or {})},
    )


def start_node(home: Path, *init: str) -> tuple[subprocess.Popen[str], str, str]:
    """`hero-node init` + `hero-node run` (embedded Valkey); returns the process, its node id
    and its websocket URL, from its ready line."""
    made = cli(home, "init", "--listen-port", "0", *init)
    assert made.returncode == 0, made.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "--home", str(home), "run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    if "ready:" not in ready:
        stop_node(proc)
        pytest.fail(f"the node did not start: {ready}{proc.stderr.read() if proc.stderr else ''}")
    words = ready.split()
    return proc, words[words.index("id") + 1], words[words.index("listen") + 1]


def stop_node(proc: subprocess.Popen[str]) -> None:
    """SIGTERM (the node stops its Valkey), SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def running_node(tmp_path):
    home = tmp_path / "home"
    proc, _, _ = start_node(home)
    try:
        yield home
    finally:
        stop_node(proc)


@pytest.fixture
def two_nodes(tmp_path):
    """Homes a (actor 1) and b (actor 2), running, each the other's peer; a dials b."""
    a, b = tmp_path / "a", tmp_path / "b"
    procs = []
    try:
        proc_a, id_a, _ = start_node(a, "--name", "a", "--actor-id", "1")
        procs.append(proc_a)
        proc_b, id_b, ws_b = start_node(b, "--name", "b", "--actor-id", "2")
        procs.append(proc_b)
        assert cli(a, "peer", "add", id_b, ws_b, "--name", "b").returncode == 0
        assert cli(b, "peer", "add", id_a, "--name", "a").returncode == 0
        yield a, b, id_b
    finally:
        for proc in procs:
            stop_node(proc)


def test_the_js_actor_reproduces_every_vector() -> None:
    out = js("selftest", str(ROOT / "tests" / "vectors"))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(list((ROOT / "tests" / "vectors").glob("ed25519-*.json"))) == 9
    assert all(line.endswith(": ok") for line in lines), out.stdout


def test_the_js_actor_runs_a_job_on_a_real_node(running_node: Path, tmp_path: Path) -> None:
    home = running_node
    key = tmp_path / "js-actor.key"
    made = js("keygen", str(key))
    assert made.returncode == 0, made.stderr
    public = made.stdout.strip()
    assert f"--pubkey {public}" in made.stderr
    assert cli(home, "actor", "add", "--id", "42", "--pubkey", public).returncode == 0
    assert cli(home, "context", "add", "1", "--admin", "1", "--executor", "42").returncode == 0
    url = cli(home, "credentials", "client").stdout.strip()
    assert url.startswith("unix://client:")

    ran = js(
        "submit",
        "--key",
        str(key),
        "--actor",
        "42",
        "--script",
        "print(6*7)",
        env={"HERO_REDIS_URL": url},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "42\n"
    assert "submitted message:42:" in ran.stderr
    assert re.search(r" in trace 00-[0-9a-f]{32}-[0-9a-f]{16}-00$", ran.stderr.splitlines()[0])

    # A trace the caller hands on is signed with the message: the node verified it (the job
    # ran) with the traceparent in the signed content (PROTOCOL.md 4.5)
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    env = {"HERO_REDIS_URL": url, "TRACEPARENT": traceparent, "TRACESTATE": "hero=1"}
    traced = js("submit", "--key", str(key), "--actor", "42", "--script", "print(7)", env=env)
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == "7\n"
    assert f"in trace {traceparent}" in traced.stderr
    bad = {"HERO_REDIS_URL": url, "TRACEPARENT": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}
    refused_trace = js("submit", "--key", str(key), "--actor", "42", "--script", "1", env=bad)
    assert refused_trace.returncode == 2
    assert "--traceparent takes" in refused_trace.stderr

    # An actor the node does not know: refused (unknown_signer), and the reply says why.
    refused = js(
        "submit",
        "--key",
        str(key),
        "--actor",
        "43",
        "--script",
        "print(1)",
        env={"HERO_REDIS_URL": url},
    )
    assert refused.returncode == 1
    assert "ended in error: unknown_signer" in refused.stderr
    dlq = cli(home, "dlq", "list", "--context", "1")
    assert "unknown_signer" in dlq.stdout, dlq.stdout + dlq.stderr


def test_the_js_actor_refuses_a_bad_url_without_a_traceback(tmp_path: Path) -> None:
    key = tmp_path / "k.json"
    assert js("keygen", str(key)).returncode == 0
    out = js(
        "submit",
        "--key",
        str(key),
        "--actor",
        "1",
        "--script",
        "x",
        env={"HERO_REDIS_URL": "http://nowhere"},
    )
    assert out.returncode == 2
    assert out.stderr.strip().endswith("must be a redis:// or unix:// URL")


def test_a_cross_node_job_needs_the_actor_at_its_origin_too(two_nodes, tmp_path: Path) -> None:
    """PROTOCOL.md section 6: the actor is registered and permitted on the destination *and* on
    the origin, whose msg_out it uses."""
    a, b, id_b = two_nodes
    key = tmp_path / "js-actor.key"
    public = js("keygen", str(key)).stdout.strip()
    assert cli(b, "actor", "add", "--id", "42", "--pubkey", public).returncode == 0
    assert cli(b, "context", "add", "1", "--admin", "2", "--executor", "42").returncode == 0
    url = cli(a, "credentials", "client").stdout.strip()
    job = ("submit", "--key", str(key), "--actor", "42", "--to", id_b, "--script", "print(6*7)")

    unknown_at_origin = js(*job, env={"HERO_REDIS_URL": url})
    assert unknown_at_origin.returncode == 1
    assert "ended in error: unknown_signer" in unknown_at_origin.stderr

    assert cli(a, "actor", "add", "--id", "42", "--pubkey", public).returncode == 0
    assert cli(a, "context", "add", "1", "--admin", "1", "--executor", "42").returncode == 0
    ran = js(*job, env={"HERO_REDIS_URL": url})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "42\n"
    job_key = re.search(r"\((job:42:[0-9]+)\)", ran.stderr)
    assert job_key is not None, ran.stderr
    on_b = cli(b, "job", "show", job_key.group(1), "--context", "1")
    assert on_b.returncode == 0, on_b.stderr
    assert json.loads(on_b.stdout)["status"] == "finished"
