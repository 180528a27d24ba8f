"""The web console (node/web/): its [console] settings, its server, its live feed, its
operator actions, and that it serves no secret. The browser test is test_console_browser.py."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from bus.core import keys
from crypto import read_key_file
from node.config import load_config
from node.config.console import ConsoleConfig, parse_console
from node.errors import ConfigError
from node.host.acl import ROLES, read_secret
from node.host.home import init_home
from node.host.launch import Ready, parse_ready_line, ready_line, start_node_process
from node.web.server import ConsoleError, bind
from tests.console_http import get, next_state, post
from tests.nodes import link_to

ON_FREE_PORT = ConsoleConfig(listen="127.0.0.1:0")
TOKEN = "s3cret-operator-token-for-tests"


# -- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ({"listen": "0.0.0.0:7780"}, "not a loopback address"),
        ({"listen": "192.0.2.7:7780"}, "allow_remote = true"),
        ({"listen": "7780"}, 'wants "host:port"'),
        ({"listen": "127.0.0.1:99999"}, 'wants "host:port"'),
        ({"listen": "127.0.0.1:7780", "tokn": "x"}, "unknown [console] setting(s): tokn"),
        ({"listen": 7780}, "[console] listen has the wrong type"),
        ({"listen": "127.0.0.1:0", "chart_every_s": "5"}, "chart_every_s has the wrong type"),
        ({"listen": "127.0.0.1:0", "chart_every_s": 0.1}, "chart_every_s wants seconds from"),
        ({"listen": "127.0.0.1:0", "chart_every_s": 3600}, "chart_every_s wants seconds from"),
        ({"listen": "127.0.0.1:0", "chart_every_s": True}, "chart_every_s wants seconds from"),
    ],
)
def test_console_settings_refused_with_their_reason(table, error):
    with pytest.raises(ConfigError, match=re.escape(error)):
        parse_console(table)


@pytest.mark.parametrize("listen", ["127.0.0.1:7780", "[::1]:7780", "localhost:0", ""])
def test_loopback_or_off_needs_no_opt_in(listen):
    assert parse_console({"listen": listen}).listen == listen


def test_non_loopback_with_the_opt_in():
    console = parse_console({"listen": "0.0.0.0:7780", "allow_remote": True, "token": "t"})
    assert console.address() == ("0.0.0.0", 7780)
    assert console.token == "t"


def test_init_gives_each_node_its_own_console_port(tmp_path: Path):
    a = init_home(tmp_path / "a", listen_port=7701)
    b = init_home(tmp_path / "b", listen_port=7702)
    c = init_home(tmp_path / "c", listen_port=0)
    assert load_config(a.home).console.listen == "127.0.0.1:7781"
    assert load_config(b.home).console.listen == "127.0.0.1:7782"
    assert load_config(c.home).console.listen == "127.0.0.1:0"
    off = init_home(tmp_path / "off", console_listen="")
    assert not load_config(off.home).console.enabled


def test_a_token_in_config_toml_is_read(tmp_path: Path):
    config = init_home(tmp_path / "h", listen_port=7701)
    text = config.config_path.read_text().replace("allow_remote = false", f'token = "{TOKEN}"')
    config.config_path.write_text(text)
    assert load_config(config.home).console == ConsoleConfig("127.0.0.1:7781", False, TOKEN)


def test_a_home_without_a_console_table_has_none(tmp_path: Path):
    config = init_home(tmp_path / "h")
    text = config.config_path.read_text()
    config.config_path.write_text(text[: text.index("# the web console")])
    assert not load_config(config.home).console.enabled


@pytest.mark.slow
def test_hero_node_init_says_where_the_console_is(tmp_path: Path):
    def init(home: str, *extra: str) -> str:
        argv = [sys.executable, "-m", "node.cli", "--home", str(tmp_path / home), "init"]
        done = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "console:    http://127.0.0.1:7783" in init("a", "--listen-port", "7703")
    assert "console:" not in init("b", "--console", "")
    assert not load_config(tmp_path / "b").console.enabled
    assert "console:    http://[::1]:9000" in init("c", "--console", "[::1]:9000")
    refused = subprocess.run(
        [sys.executable, "-m", "node.cli", "--home", str(tmp_path / "d"), "init"]
        + ["--console", "0.0.0.0:9000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert "allow_remote = true" in refused.stderr
    assert "Traceback" not in refused.stderr


# -- serving -----------------------------------------------------------------------------------


def _busy_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def test_a_port_in_use_is_one_clear_error():
    with _busy_port() as busy:
        port = busy.getsockname()[1]
        with pytest.raises(ConsoleError) as caught:
            bind("127.0.0.1", port)
    message = str(caught.value)
    assert message.startswith(f"console: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in message
    assert "[console] listen" in message
    assert "\n" not in message


@pytest.mark.slow
def test_hero_node_run_says_so_without_a_traceback(tmp_path: Path):
    with _busy_port() as busy:
        port = busy.getsockname()[1]
        home = tmp_path / "h"
        init_home(home, listen_port=0, console_listen=f"127.0.0.1:{port}")
        run = subprocess.run(
            [sys.executable, "-m", "node.cli", "--home", str(home), "run"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode == 2  # the operator's to fix, as for a home in use
    assert "Traceback" not in run.stderr, run.stderr
    assert f"hero-node: console: cannot listen on 127.0.0.1:{port}: " in run.stderr


async def test_page_and_feed_show_a_job_submitted_after_they_opened(node_factory):
    node = await node_factory("a", console=ON_FREE_PORT)
    url = node.info.console_url
    assert url.startswith("http://127.0.0.1:")
    status, headers, page = await get(url + "/")
    assert status == 200
    assert b"/static/console.js" in page
    assert "default-src 'self'" in headers["content-security-policy"]
    status, _, script = await get(url + "/static/console.js")
    assert status == 200
    assert b"EventSource" in script
    actor = read_key_file(node.config.actor_key_path)
    with trio.fail_after(30):
        first = await next_state(url + "/api/events", lambda s: True)
        message = await node.client.submit_job(
            actor, 1, to="self", context_id=1, script_type="python", script="print(6*7)"
        )
        job_key = message.job[0].key
        assert job_key not in {j["key"] for j in first["jobs"]}

        def finished(state: dict) -> bool:
            return any(j["key"] == job_key and j["status"] == "finished" for j in state["jobs"])

        state = await next_state(url + "/api/events", finished)
    [job] = [j for j in state["jobs"] if j["key"] == job_key]
    assert job["type"] == "python"
    assert job["stdout"] == "42\n"
    assert job["exit_code"] == "0"
    assert job["duration_s"] is not None
    assert job["node"] == "a"
    [ctx] = state["contexts"]
    assert ctx["id"] == 1
    assert "queue:python" in ctx["queues"]
    assert {r["script_type"] for r in ctx["runners"]} == {"python", "sh"}
    assert state["node"]["name"] == "a"
    assert state["actions"] is False
    [msg] = [m for m in state["messages"] if m["key"] == message.key]
    assert msg["status"] == "processed" or msg["status"] == "acknowledged"


async def test_a_loopback_console_answers_only_for_loopback_names(node_factory):
    node = await node_factory("a", console=ON_FREE_PORT)
    url = node.info.console_url
    port = url.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST"):
        status, _, _ = await get(url + "/api/state", {"Host": host})
        assert status == 200, host
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        for path in ("/", "/api/state", "/api/events"):
            status, _, body = await get(url + path, {"Host": host})
            assert status == 421, (host, path)
            assert b"job" not in body


async def test_allow_remote_answers_for_any_host_name(node_factory):
    node = await node_factory("a", console=ConsoleConfig("127.0.0.1:0", allow_remote=True))
    status, _, _ = await get(node.info.console_url + "/api/state", {"Host": "node.example"})
    assert status == 200


async def test_peers_show_link_state_round_trip_and_outbox(node_factory):
    alice = await node_factory("alice", console=ON_FREE_PORT)
    bob = await node_factory("bob")
    await link_to(alice, bob)
    with trio.fail_after(30):
        state = await next_state(
            alice.info.console_url + "/api/events",
            lambda s: any(p["link"] == "up" and p["rtt_ms"] is not None for p in s["peers"]),
        )
    [peer] = state["peers"]
    assert peer["id"] == bob.node_id
    assert peer["name"] == "bob"
    assert peer["rtt_ms"] >= 0
    assert peer["last_seen"] > 0
    assert peer["outbox"] == 0
    assert 0 < peer["since"] <= state["now"]
    bob.stop()
    with trio.fail_after(30):
        state = await next_state(
            alice.info.console_url + "/api/events",
            lambda s: s["peers"][0]["link"] == "down",
        )
    assert state["peers"][0]["since"] >= peer["since"]


# -- operator actions --------------------------------------------------------------------------


async def test_actions_refused_without_a_configured_token(node_factory):
    node = await node_factory("a", console=ON_FREE_PORT)
    await node.store.dead_letter(1, "message:1:5", "malformed", "test", queue=keys.MSG_OUT)
    status, answer = await post(node.info.console_url + "/api/dlq/purge", {"context": 1}, TOKEN)
    assert status == 403
    assert "read-only" in answer["error"]
    assert await node.store.llen(1, keys.DLQ) == 1


async def test_actions_need_the_token_and_then_work(node_factory):
    node = await node_factory("a", console=ConsoleConfig("127.0.0.1:0", token=TOKEN))
    base = node.info.console_url
    store = node.store
    for n in (5, 6):
        await store.dead_letter(1, f"message:1:{n}", "malformed", "test", queue=keys.MSG_OUT)
    for token in (None, "", TOKEN + "x", TOKEN[:-1]):
        status, answer = await post(base + "/api/dlq/purge", {"context": 1}, token)
        assert status == 401, token
    assert await store.llen(1, keys.DLQ) == 2
    status, answer = await post(base + "/api/dlq/purge", {"context": "1"}, TOKEN)
    assert status == 400
    assert "context" in answer["error"]
    status, answer = await post(base + "/api/dlq/retry", {"context": 1}, TOKEN)
    assert status == 400
    assert "key" in answer["error"]
    status, answer = await post(base + "/api/dlq/purge", {"context": 9}, TOKEN)
    assert status == 404
    one = {"context": 1, "key": "message:1:5"}
    assert await post(base + "/api/dlq/purge", one, TOKEN) == (200, {"purged": 1})
    assert [e["key"] for e in await store.dead_letters(1)] == ["message:1:6"]
    assert await post(base + "/api/dlq/purge", {"context": 1}, TOKEN) == (200, {"purged": 1})
    assert await store.llen(1, keys.DLQ) == 0


async def test_retry_re_drives_a_dead_letter(node_factory):
    node = await node_factory("a", console=ConsoleConfig("127.0.0.1:0", token=TOKEN))
    actor = read_key_file(node.config.actor_key_path)
    message = await node.client.submit_job(
        actor, 1, to="self", context_id=1, script_type="python", script="print(1)"
    )
    [result] = await node.client.wait_results(message, timeout_s=30)
    # the job ran; dead-letter a fresh copy of a queue entry to re-drive
    await node.store.dead_letter(1, message.job[0].key, "malformed", "test", queue="queue:x")
    status, answer = await post(
        node.info.console_url + "/api/dlq/retry",
        {"context": 1, "key": message.job[0].key},
        TOKEN,
    )
    assert (status, answer) == (200, {"retried": 1})
    assert await node.store.llen(1, keys.DLQ) == 0
    assert await node.store.lrange(1, "queue:x") == [message.job[0].key]


# -- nothing secret is served ------------------------------------------------------------------


async def test_no_key_material_password_or_token_is_served(node_factory):
    node = await node_factory("a", embedded=True, console=ConsoleConfig("127.0.0.1:0", token=TOKEN))
    home, base = node.config.home, node.info.console_url
    actor = read_key_file(node.config.actor_key_path)
    message = await node.client.submit_job(
        actor,
        1,
        to="self",
        context_id=1,
        script_type="sh",
        script="echo hi",
        env_vars={"API_PASSWORD": "env-secret-value"},
    )
    await node.client.wait_results(message, timeout_s=30)
    await node.store.dead_letter(1, "message:1:7", "malformed", "test", queue=keys.MSG_OUT)
    served = []
    for path in ("/", "/static/console.js", "/static/console.css", "/api/state"):
        status, _, body = await get(base + path)
        assert status == 200, path
        served.append(body.decode())
    raw: list[str] = []
    with trio.fail_after(30):
        await next_state(base + "/api/events", lambda s: bool(s["jobs"]), raw)
    served.append("\n".join(raw))
    text = "\n".join(served)
    assert message.job[0].key in text  # the feed did show the job
    secrets = [read_secret(home, role) for role in ROLES]
    node_key = read_key_file(node.config.node_key_path)
    secrets += [node_key.seed.hex(), actor.seed.hex(), TOKEN, "env-secret-value"]
    secrets += [node.config.node_key_path.read_text(), node.config.actor_key_path.read_text()]
    for secret in secrets:
        assert secret.strip()
        assert secret.strip() not in text
    assert "redis_url" not in text


def test_the_ready_line_names_the_console():
    ready = Ready("ab" * 32, "ws://127.0.0.1:7701", "unix://node@/h/run/valkey.sock")
    assert parse_ready_line(ready_line("a", ready)) == ready
    with_console = replace(ready, console_url="http://127.0.0.1:7781")
    assert parse_ready_line(ready_line("a", with_console)) == with_console


@pytest.mark.slow
async def test_hero_node_run_serves_the_console_and_stops_on_sigterm(tmp_path: Path):
    home = tmp_path / "h"
    init_home(home, listen_port=0)
    proc, ready = await start_node_process(home, log_level="warning")
    try:
        assert ready.console_url.startswith("http://127.0.0.1:")
        status, _, page = await get(ready.console_url + "/")
        assert status == 200
        assert b"hero-node" in page
        with trio.fail_after(30):
            state = await next_state(ready.console_url + "/api/events", lambda s: True)
        assert state["node"]["id"] == ready.node_id
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
