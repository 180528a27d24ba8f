"""`hero-node run` on a port already in use (issue 45): for each port the node binds, one
line that names the port, the setting and the fix, exit 2, no traceback, nothing left running."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from node.host.home import init_home
from node.host.valkey import stop_stale

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("setting", "what"),
    [
        ("listen_port", "the link listener"),
        ("valkey_port", "the embedded Valkey"),
        ("[console] listen", "console:"),
    ],
)
def test_a_port_in_use_is_named_with_its_fix_and_exit_2(tmp_path, setting, what):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        ports = {
            "listen_port": {"listen_port": port, "console_listen": ""},
            "valkey_port": {"listen_port": 0, "valkey_port": port, "console_listen": ""},
            "[console] listen": {"listen_port": 0, "console_listen": f"127.0.0.1:{port}"},
        }[setting]
        config = init_home(tmp_path / "h", **ports)  # type: ignore[arg-type]
        try:
            run = subprocess.run(
                [sys.executable, "-m", "node.cli", "--home", str(tmp_path / "h"), "run"],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
                check=False,
            )
            left = subprocess.run(
                ["pgrep", "-af", "valkey-server"], capture_output=True, text=True, check=False
            ).stdout
            assert str(tmp_path / "h") not in left  # its embedded Valkey stopped with it
        finally:
            stop_stale(config.valkey_dir)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    [line] = [x for x in run.stderr.splitlines() if x.startswith("hero-node: ")]
    assert line.startswith(f"hero-node: {what} cannot listen on 127.0.0.1:{port}: ")
    assert "the port is in use" in line
    assert f"ss -ltnp 'sport = :{port}'" in line
    assert f"set {setting} in config.toml to a free" in line
    assert run.stdout == ""  # never announced ready
