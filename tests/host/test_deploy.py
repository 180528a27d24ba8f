"""deploy/: the systemd unit, the container image and the 3-node compose testnet, checked as far
as this machine allows (systemd-analyze if present; the image is built only where a container
daemon answers)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (DEPLOY / "hero-node.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            name, _, value = line.partition("=")
            settings.setdefault(name, []).append(value)
    return settings


def test_unit_is_hardened_and_stops_gracefully():
    s = unit_settings()
    assert s["DynamicUser"] == ["yes"]
    assert s["ProtectSystem"] == ["strict"]
    assert s["StateDirectory"] == ["hero-node"]
    assert s["ReadWritePaths"] == ["/var/lib/hero-node"]
    assert s["Environment"] == ["HERO_NODE_HOME=/var/lib/hero-node"]
    for flag in ("ProtectHome", "NoNewPrivileges", "PrivateTmp"):
        assert s[flag] == ["yes"], flag
    assert s["Restart"] == ["on-failure"]
    assert s["StartLimitBurst"] == ["5"]
    assert (s["KillSignal"], s["KillMode"]) == (["SIGTERM"], ["mixed"])
    # the stop timeout leaves the node its default grace_s to drain
    assert int(s["TimeoutStopSec"][0]) > 10
    assert s["ExecStart"][0].endswith("hero-node run")


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_unit_verifies(tmp_path):
    # verify checks that the commands exist: point them at this environment's hero-node
    text = (DEPLOY / "hero-node.service").read_text()
    unit = tmp_path / "hero-node.service"
    unit.write_text(text.replace("/opt/hero-node/bin/", f"{BIN}/"))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    problems = [line for line in done.stderr.splitlines() if str(unit) in line]
    assert done.returncode == 0, done.stderr
    assert not problems, done.stderr


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_dockerfile_copies_existing_paths_and_runs_unprivileged():
    steps = dockerfile_instructions()
    copies = [shlex.split(args) for kind, args in steps if kind == "COPY"]
    assert copies
    for words in copies:
        sources = [w for w in words if not w.startswith("--")][:-1]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
    allowed = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for words in copies:  # and the build context lets each of them in
        for source in [w for w in words if not w.startswith("--")][:-1]:
            assert f"!{source.rstrip('/')}" in [a.rstrip("/") for a in allowed], source
    users = [args for kind, args in steps if kind == "USER"]
    assert users
    assert users[-1] not in ("root", "0")
    [health] = [args for kind, args in steps if kind == "HEALTHCHECK"]
    assert '"hero-node", "status"' in health
    env = " ".join(args for kind, args in steps if kind == "ENV")
    home = re.search(r"HERO_NODE_HOME=(\S+)", env)
    assert home is not None
    assert any(home[1] in args for kind, args in steps if kind == "VOLUME")
    assert steps[0][0] == "FROM"
    assert "-slim" in steps[0][1]


def test_compose_defines_a_wired_three_node_testnet():
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = doc["services"]
    assert sorted(services) == ["node1", "node2", "node3"]
    homes = set()
    for name, svc in services.items():
        env = svc["environment"]
        assert env["HERO_NODE_NAME"] == name
        assert sorted(env["HERO_PEERS"].split()) == sorted(set(services) - {name})
        [home] = [v.split(":")[0] for v in svc["volumes"] if v.endswith(":/var/lib/hero-node")]
        homes.add(home)
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY / svc["build"]["context"] / svc["build"]["dockerfile"]).exists()
    assert len(homes) == 3
    assert homes <= set(doc["volumes"])
    assert len({s["environment"]["HERO_ACTOR_ID"] for s in services.values()}) == 3


@pytest.mark.parametrize(
    "script", ["entrypoint.sh", "testnet-wire.sh", "store-init.sh", "store-server.sh"]
)
def test_shell_scripts_parse(script):
    subprocess.run(["sh", "-n", str(DEPLOY / script)], check=True)


def test_entrypoint_creates_a_listening_home_once(tmp_path):
    home = tmp_path / "home"
    env = os.environ | {
        "HERO_NODE_HOME": str(home),
        "HERO_NODE_NAME": "n1",
        "HERO_ACTOR_ID": "7",
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("HERO_TESTNET_DIR", None)
    entry = [str(DEPLOY / "entrypoint.sh")]
    ran = subprocess.run([*entry, "echo", "ran"], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.endswith("ran\n")
    config = tomllib.loads((home / "config.toml").read_text())["node"]
    assert (config["name"], config["listen_host"], config["actor_id"]) == ("n1", "0.0.0.0", 7)
    key = (home / "node.key").read_bytes()
    again = subprocess.run([*entry, "true"], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert (home / "node.key").read_bytes() == key  # a restart keeps the node's identity


def container_tool() -> str | None:
    for tool in ("docker", "podman"):
        if shutil.which(tool):
            info = subprocess.run([tool, "info"], capture_output=True, timeout=30, check=False)
            if info.returncode == 0:
                return tool
    return None


def test_image_builds():
    tool = container_tool()
    if tool is None:
        pytest.skip("no container tool with a running daemon (docker/podman info failed)")
    tag = "hero-node:test"
    build = [tool, "build", "-f", str(DEPLOY / "Dockerfile"), "-t", tag, str(ROOT)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ran = subprocess.run(
        [tool, "run", "--rm", "--entrypoint", "hero-node", tag, "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert "hero-node" in ran.stdout


def test_compose_replicated_has_a_primary_two_replicas_three_sentinels_and_a_node():
    doc = yaml.safe_load((DEPLOY / "compose-replicated.yaml").read_text())
    services = doc["services"]
    data = {
        n: s for n, s in services.items() if s.get("entrypoint") == ["hero-store-server", "data"]
    }
    sentinels = [
        n for n, s in services.items() if s.get("entrypoint") == ["hero-store-server", "sentinel"]
    ]
    assert sorted(data) == ["valkey1", "valkey2", "valkey3"]
    assert [n for n, s in data.items() if "REPLICA_OF" not in s["environment"]] == ["valkey1"]
    assert {s["environment"].get("REPLICA_OF") for n, s in data.items() if n != "valkey1"} == {
        "valkey1"
    }
    assert len(sentinels) == 3
    assert "node" in services
    assert "store-init" in services
    volumes = [v.split(":")[0] for s in services.values() for v in s.get("volumes", [])]
    assert set(volumes) <= set(doc["volumes"])


def test_store_init_writes_configurations_a_real_valkey_accepts(tmp_path):
    """store-init's data.conf and ACL start a real valkey-server (its port and dir moved to
    this test's), where the node's user, and only it, gets in."""
    from node.host.valkey import ValkeySpec, find_valkey_binary, free_port, ping

    home, store = tmp_path / "home", tmp_path / "store"
    store.mkdir()
    env = os.environ | {
        "HERO_NODE_HOME": str(home),
        "HERO_STORE_DIR": str(store),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run([str(DEPLOY / "store-init.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    config = tomllib.loads((home / "config.toml").read_text())
    assert config["store"]["sentinels"] == [f"sentinel{i}:26379" for i in (1, 2, 3)]
    conf = (store / "data.conf").read_text()
    assert "appendfsync always" in conf
    assert "min-replicas-to-write 1" in conf
    assert "masteruser replica" in conf
    sentinel = (store / "sentinel.conf").read_text()
    assert "sentinel auth-user hero sentinel" in sentinel
    assert "user client on #" in sentinel
    port = free_port()
    spec = ValkeySpec(
        port=port,
        data_dir=tmp_path,
        auth=("node", (home / "secrets" / "valkey-node").read_text().strip()),
    )
    proc = subprocess.Popen(
        [
            str(find_valkey_binary()),
            str(store / "data.conf"),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, b""):
            if b"Ready to accept connections" in line:
                break
        assert ping(spec)
        assert not ping(ValkeySpec(port=port, data_dir=tmp_path, auth=("node", "wrong")))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
