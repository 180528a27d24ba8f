"""README's quick starts, typed as a new user types them: from a directory of their own, with
relative homes (``--home a``, ``$HERO_NODE_HOME``), through a shell, real node processes and real
links, until their jobs answer.

The command lists below are README's ("Quick start: one node by hand", "Quick start: two nodes
by hand") character for character; README must keep showing exactly these. The one change the
test makes is to ports: README's fixed ones (7700 by default, 7701, 7702, and the web consoles
at the port + 80) become free ones, since other tests run beside this one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from node.cli.common import home_of
from node.cli.main import build_parser
from node.cli.parsing import walk
from node.host.valkey import stop_stale
from tests.nodeproc import stable_port

ONE_NODE = """\
.venv/bin/hero-node init                  # ~/.hero-node (or $HERO_NODE_HOME, or --home DIR)
.venv/bin/hero-node run &                 # embedded Valkey, websocket listener, runners
.venv/bin/hero-node job submit --to self --context 1 --type python --script 'print(6*7)' --wait
"""

TWO_NODES = """\
hero-node --home a init --name a --listen-port 7701 --actor 1
hero-node --home b init --name b --listen-port 7702 --actor 2
hero-node --home a run &
hero-node --home b run &
# each node learns the other's id (its public key) and address
hero-node --home a peer add "$(hero-node --home b id)" wss://127.0.0.1:7702 --name b
hero-node --home b peer add "$(hero-node --home a id)" wss://127.0.0.1:7701 --name a
# b learns a's actor 1 and lets it execute in b's context 1
hero-node --home b actor add --actor 1 --pubkey "$(hero-verify pubkey a/actor.key)"
hero-node --home b context add 1 --admin 2 --executor 1
hero-node --home a job submit --to b --type sh --script 'echo hello from $(hostname)' --wait
"""

BACKGROUND = re.compile(r"^(?P<command>.*?)\s&\s*(#.*)?$")
COMMAND_S = 120  # a --wait on a loaded two-core machine, the first job's sandbox start included


def with_free_ports(line: str, ports: dict[str, int]) -> str:
    """``line`` with README's fixed ports replaced by free ones (the test's only change)."""
    for fixed, port in ports.items():
        line = line.replace(fixed, str(port))
    if re.search(r"\binit\b", line):
        line = line.split("#", 1)[0].rstrip()
        if "--listen-port" not in line:  # README's one node listens on the default, 7700
            line += f" --listen-port {stable_port()}"
        line += f" --console 127.0.0.1:{stable_port()}"
    return line


class Session:
    """A shell user's session: each line through bash in ``cwd``, ``&`` lines left running (a
    node: the line returns once its ready line is out), stopped by PID at the end."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.ports = {"7701": stable_port(), "7702": stable_port()}
        self.background: list[trio.Process] = []
        self.transcript: list[str] = []

    async def type(self, script: str) -> str:
        """Runs every line of ``script``; returns the last command's stdout."""
        out = ""
        for typed in script.splitlines():
            if not typed.strip() or typed.lstrip().startswith("#"):
                continue
            line = with_free_ports(typed, self.ports)
            self.transcript.append(f"$ {line}")
            started = BACKGROUND.match(line)
            if started:
                await self._start(started["command"])
                continue
            with trio.fail_after(COMMAND_S):
                done = await trio.run_process(
                    ["bash", "-c", line],
                    cwd=self.cwd,
                    env=self.env,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            out = done.stdout.decode()
            self.transcript.append(out + done.stderr.decode())
            assert done.returncode == 0, "\n".join(self.transcript)
        return out

    async def _start(self, command: str) -> None:
        log = (self.cwd / f"background-{len(self.background)}.log").open("wb")
        proc = await trio.lowlevel.open_process(
            ["bash", "-c", f"exec {command}"],  # exec: the PID is the node's own
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()
        self.background.append(proc)
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(COMMAND_S):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                if not chunk:
                    break
                line += chunk
        self.transcript.append(line.decode())
        assert b"ready:" in line, "\n".join(self.transcript) + self._logs()

    def _logs(self) -> str:
        return "".join(
            f"\n--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.cwd.glob("background-*.log"))
        )

    async def close(self) -> None:
        with trio.CancelScope(shield=True):
            for proc in self.background:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in self.background:
                with trio.move_on_after(30):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            for valkey in self.cwd.glob("*/valkey"):  # a node killed leaves its Valkey
                await trio.to_thread.run_sync(stop_stale, valkey)


@pytest.fixture
async def session(tmp_path):
    """A directory like a fresh clone's (``.venv`` is this interpreter's environment), with
    ``hero-node`` on PATH, and HOME inside it: nothing reaches the user's ~/.hero-node."""
    venv = Path(sys.prefix)
    if not (venv / "bin" / "hero-node").exists():
        pytest.fail(f"no hero-node script in {venv}/bin: install the project (pip install -e .)")
    (tmp_path / ".venv").symlink_to(venv)
    env = os.environ | {
        "HOME": str(tmp_path),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    you = Session(tmp_path, env)
    try:
        yield you
    finally:
        await you.close()


async def test_one_node_quick_start_with_a_relative_hero_node_home(session):
    session.env["HERO_NODE_HOME"] = "one"  # relative, as `export HERO_NODE_HOME=one` sets it
    assert await session.type(ONE_NODE) == "42\n", "\n".join(session.transcript)
    assert (session.cwd / "one" / "config.toml").exists()


async def test_two_nodes_quick_start_with_relative_homes(session):
    answer = await session.type(TWO_NODES)
    assert answer.startswith("hello from "), "\n".join(session.transcript)
    assert sorted(p.name for p in session.cwd.iterdir() if (p / "config.toml").exists()) == [
        "a",
        "b",
    ]


def test_every_home_is_absolute_once_parsed(tmp_path, monkeypatch):
    """Each --home of the command tree (before or after any command) and $HERO_NODE_HOME."""
    monkeypatch.chdir(tmp_path)
    root = build_parser()
    homes = [a for p in walk(root) for a in p._actions if "--home" in a.option_strings]
    assert len(homes) > 20  # the top level's and each command's
    assert {a.type("a/../b") for a in homes} == {tmp_path / "b"}
    assert home_of(root.parse_args(["run", "--home", "x"])) == tmp_path / "x"
    assert home_of(root.parse_args(["--home", "x", "run"])) == tmp_path / "x"
    monkeypatch.setenv("HERO_NODE_HOME", "env-home")
    assert home_of(root.parse_args(["run"])) == tmp_path / "env-home"


def test_readme_shows_exactly_these_quick_starts():
    """The commands this file types are README's own: a README that changes them without this
    file (or the reverse) fails here, so the quick starts a newcomer reads stay the ones tested."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    assert ONE_NODE in [b.split("42\n")[0] for b in blocks], "README's one-node quick start moved"
    assert TWO_NODES in blocks, "README's two-node quick start changed"
