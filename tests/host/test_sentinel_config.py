"""The replicated store's settings: the redis+sentinel:// URL, the [store] table, `init
--sentinel`, and the ACL users each server gets (no servers: see test_failover.py for those)."""

from __future__ import annotations

import tomllib

import pytest

from bus.core.urls import redact
from bus.store.sentinel import parse_sentinel_url, sentinel_url
from node.cli.main import main
from node.config import load_config
from node.config.store import StoreConfig, parse_store
from node.errors import ConfigError
from node.host.replicated import SET_ROLES, data_acl, sentinel_conf, store_acl


def test_a_sentinel_url_round_trips_and_redacts():
    url = sentinel_url([("10.0.0.1", 26379), ("::1", 26380)], "hero", "client", "p@ss:w/rd")
    target = parse_sentinel_url(url)
    assert target.sentinels == (("10.0.0.1", 26379), ("::1", 26380))
    assert (target.service, target.username, target.password) == ("hero", "client", "p@ss:w/rd")
    assert (target.waitaof_local, target.waitaof_replicas, target.waitaof_timeout_ms) == (
        1,
        1,
        1000,
    )
    assert "p%40ss" not in redact(url)
    assert redact(url).startswith("redis+sentinel://client@10.0.0.1:26379,")
    off = parse_sentinel_url(url + "?waitaof=0,0&waitaof_timeout_ms=5")
    assert not off.durable


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://h:1/0", "not a redis.sentinel"),
        ("redis+sentinel://h:1", "service"),
        ("redis+sentinel://h/hero", "host:port"),
        ("redis+sentinel://h:1/hero?waitaof=2,1", "L is 0 or 1"),
        ("redis+sentinel://h:1/hero?waitaof=x", "whole numbers"),
        ("redis+sentinel://h:1/hero?db=3", "unknown"),
        ("redis+sentinel://h:1/hero?promise=two-replicas", "promise is one of"),
    ],
)
def test_a_bad_sentinel_url_says_what_is_wrong(url, says):
    with pytest.raises(ValueError, match=says):
        parse_sentinel_url(url)


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"sentinels": "h:1"}, "wrong type"),
        ({"sentinels": ["h"]}, "host:port"),
        ({"waitaof_local": 2}, "waitaof_local"),
        ({"service": ""}, "service"),
        ({"primary": "x"}, "unknown"),
        ({"promise": "some-replicas"}, "promise is one of"),
    ],
)
def test_a_bad_store_table_is_refused(table, says):
    with pytest.raises(ConfigError, match=says):
        parse_store(table)


def test_the_promise_is_every_replica_unless_the_store_table_says_one_replica():
    """The setting reaches every process through the URL; the weak one is said at start."""
    default = StoreConfig(sentinels=["h:1"])
    assert parse_sentinel_url(default.url("node", "pw")).promise == "every-replica"
    assert parse_sentinel_url("redis+sentinel://h:1/hero").promise == "every-replica"
    assert default.weak_promise is None
    weak = parse_store({"sentinels": ["h:1"], "promise": "one-replica"})
    assert parse_sentinel_url(weak.url("node", "pw")).promise == "one-replica"
    assert weak.weak_promise is not None
    assert "ONE replica" in weak.weak_promise


def test_init_says_the_weaker_promise_only_when_asked(tmp_path):
    home = tmp_path / "home"
    argv = ["--home", str(home), "init", "--sentinel", "127.0.0.1:26379"]
    assert main([*argv, "--promise", "one-replica"]) == 0
    assert load_config(home).store.promise == "one-replica"


def test_init_with_sentinels_writes_the_store_table_and_every_password(tmp_path):
    home = tmp_path / "home"
    argv = ["--home", str(home), "init", "--sentinel", "127.0.0.1:26379"]
    assert main([*argv, "--sentinel", "127.0.0.1:26380", "--waitaof", "1,2"]) == 0
    store = tomllib.loads((home / "config.toml").read_text())["store"]
    assert store["sentinels"] == ["127.0.0.1:26379", "127.0.0.1:26380"]
    assert (store["waitaof_local"], store["waitaof_replicas"]) == (1, 2)
    assert store["promise"] == "every-replica"
    config = load_config(home)
    assert config.store.replicated
    for role in SET_ROLES:
        assert (home / "secrets" / f"valkey-{role}").stat().st_mode & 0o777 == 0o600
    # config.toml never holds a password; the URL each role connects with does
    assert "valkey" not in (home / "config.toml").read_text().split("[store]")[1]


def test_embedded_default_keeps_no_store():
    assert not StoreConfig().replicated


def test_servers_admit_only_named_users_and_sentinels_only_tell_where_the_primary_is():
    passwords = {r: f"pw-{r}" for r in SET_ROLES}
    acl = data_acl(passwords)
    assert acl.startswith("user default off")
    assert "pw-" not in acl  # only hashes
    replica = next(line for line in acl.splitlines() if line.startswith("user replica "))
    assert "+psync" in replica
    assert "~" not in replica  # no key at all
    conf = sentinel_conf(26379, ("127.0.0.1", 6379), passwords)
    client = next(line for line in conf.splitlines() if line.startswith("user client "))
    assert "+sentinel|get-master-addr-by-name" in client
    assert "+@all" not in client
    assert "sentinel|failover" not in client
    assert "masterauth pw-replica" in store_acl("replica", passwords, "hero")
