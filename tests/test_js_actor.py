"""The JavaScript reference actor (examples/js, written from PROTOCOL.md) against the vectors and
a real node: `hero-node run` with its embedded Valkey, the actor registered with the CLI, the
job submitted by the JavaScript program through the URL of `hero-node credentials client`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.fixture
def running_node(tmp_path):
    """`hero-node init` + `hero-node run` (embedded Valkey); stopped with SIGTERM by its PID."""
    home = tmp_path / "home"
    init = cli(home, "init", "--listen-port", "0")
    assert init.returncode == 0, init.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "--home", str(home), "run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert "ready:" in ready, proc.stderr.read() if proc.poll() is not None else ready
        yield home
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_the_js_actor_reproduces_every_vector() -> None:
    out = js("selftest", str(ROOT / "tests" / "vectors"))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(list((ROOT / "tests" / "vectors").glob("ed25519-*.json"))) == 7
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
