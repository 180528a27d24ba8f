"""Creating a node's home directory (``hero-node init``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from crypto import KeyPair, write_key_file
from node.config import NodeConfig, render_config
from node.config.console import ConsoleConfig, check_console, default_listen
from node.config.store import StoreConfig
from node.errors import ConfigError
from node.host.acl import ROLES, ensure_secrets
from node.host.hardening import ensure_admission_key
from node.host.replicated import SET_ROLES


def init_home(
    home: Path,
    *,
    name: str = "node",
    listen_port: int = 7700,
    redis_url: str = "",
    passphrase: bytes | None = None,
    force: bool = False,
    runners: dict[str, int] | None = None,
    actor_id: int = 1,
    link_encryption: str = "tls",
    valkey_port: int = 0,
    grace_s: float = 10.0,
    console_listen: str | None = None,
    store: StoreConfig | None = None,
) -> NodeConfig:
    """Create ``home`` with a node key, a default actor key, the Valkey passwords (secrets/) and
    config.toml; return the config.

    ``store``: a replicated store behind Sentinels (its passwords are made too: the ACL
    users of every data server and Sentinel, and theirs: ``hero-node store-acl``).

    ``console_listen``: the web console's "host:port" ("" off; None: 127.0.0.1, port
    ``listen_port`` + 80, or a free one if ``listen_port`` is 0).

    Raises ConfigError if a configuration already exists there (unless ``force``), or for a
    console address that cannot be served.
    """
    if console_listen is None:
        console_listen = default_listen(listen_port)
    console = ConsoleConfig(listen=console_listen)
    check_console(console)
    config = NodeConfig(
        home=home,
        name=name,
        listen_port=listen_port,
        redis_url=redis_url,
        actor_id=actor_id,
        link_encryption=link_encryption,
        valkey_port=valkey_port,
        grace_s=grace_s,
        console=console,
        store=store or StoreConfig(),
    )
    if runners is not None:
        config = replace(config, runners=dict(runners))
    if config.config_path.exists() and not force:
        raise ConfigError(f"{home} already holds a node (config.toml); use --force to replace it")
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    for path in (config.node_key_path, config.actor_key_path):
        if not path.exists() or force:
            write_key_file(path, KeyPair.generate(), passphrase=passphrase, overwrite=force)
    # passwords of the embedded Valkey's ACL users (node/host/acl.py), and run/ for its socket
    ensure_secrets(home, SET_ROLES if config.store.replicated else ROLES)
    ensure_admission_key(home)  # the key of the job hashes' admission stamp
    config.run_dir.mkdir(mode=0o700, exist_ok=True)
    config.run_dir.chmod(0o700)
    config.config_path.write_text(render_config(config), encoding="utf-8")
    return config
