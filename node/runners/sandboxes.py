"""The node's configuration turned into its isolation (at start) and each slot's sandbox."""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from typing import Any

from node.config import NodeConfig
from node.sandbox.disk import work_root_of
from node.sandbox.limits import limits_for, raised
from node.sandbox.probe import Isolation, probe, sandbox_spec
from node.sandbox.settings import bwrap_of, context_settings

log = logging.getLogger("node.sandbox")


def work_root(config: NodeConfig) -> Any:  # noqa: ANN401 - a Path
    """Where each context's work dir is (``<home>/work/<context id>``)."""
    return work_root_of(config.home)


_EXPLAINED = {
    "strict": "each context's jobs run as their own uid (job_uid_base + context id) in "
    "bubblewrap, under seccomp and limits",
    "namespaces": "jobs run as this node's user in bubblewrap, under seccomp and limits; for "
    "strict, run the node as root or with CAP_SETUID, CAP_SETGID and CAP_CHOWN",
    "none": "WARNING: jobs run without a sandbox: any job can read this node's secrets",
    "refused": 'NO JOB WILL RUN until a sandbox can be built, or isolation = "none" is set '
    "(no isolation); jobs sent here are answered isolation_refused",
}


def explain(iso: Isolation) -> str:
    """What ``iso`` means for jobs, in a sentence (hero-node init)."""
    return _EXPLAINED.get(iso.mode, "")


def probe_config(config: NodeConfig) -> Isolation:
    """The isolation ``config`` gets on this host (sandboxes are started to find out)."""
    root = work_root(config)
    root.mkdir(mode=0o711, exist_ok=True)
    return probe(config.isolation, config.home, bwrap_of(config.sandbox), root, config.job_uid_base)


def find_isolation(config: NodeConfig) -> Isolation:
    """Probe the host for the configured mode and say at start what was found."""
    iso = probe_config(config)
    if iso.mode == "none":
        log.warning("ISOLATION OFF: %s; any job can read this node's secrets", iso.why)
    elif iso.mode == "refused":
        log.error("this node runs no job: %s", iso.why)
        if iso.fix:
            log.error("to run jobs here: %s", iso.fix)
    else:
        log.info("isolation %s (%s); limits by %s", iso.mode, iso.why, iso.limits)
    if iso.bwrap_info:
        log.info("bwrap: %s", iso.bwrap_info)
    for bound in raised(config.limits):
        log.warning("A BOUND RAISED FOR ONE CONTEXT: %s", bound)
    return iso


def slot_sandbox(config: NodeConfig, iso: Isolation, ctx: int) -> dict[str, Any]:
    """The SandboxSpec of context ``ctx``'s slots, as the RunnerSpec carries it."""
    own = context_settings(config.sandbox, ctx)
    limits = limits_for(config.limits, ctx).to_json()
    root, uids = work_root(config), config.job_uid_base
    spec = sandbox_spec(
        iso, root, ctx, uids, limits, own.network, own.recycle_jobs, own.fresh_process
    )
    spec = replace(spec, work_dir_policy=own.work_dir)
    return asdict(spec)
