"""Why this host refuses the namespaces a sandbox needs, and what to do about it, in a line or two.

bwrap says only "Operation not permitted" or "No permissions to create new namespace"; the cause
is one of a few host policies, each with its own fix: Ubuntu's AppArmor restriction of
unprivileged user namespaces (23.10 and later), Debian's older
``kernel.unprivileged_userns_clone``, ``user.max_user_namespaces = 0``, or a seccomp filter on
the node itself (a container's default profile refuses ``unshare`` and clone's namespace
flags). The facts are read once from /proc (:func:`read_policy`); :func:`hint` is pure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# what bwrap writes when the kernel refuses it a namespace (its messages since 0.4)
REFUSED_MARKS = ("new namespace", "Operation not permitted", "uid map", "setting up uid")


@dataclass(frozen=True)
class HostPolicy:
    """The host's settings that decide whether a process may make namespaces (None: absent)."""

    apparmor_restrict: str | None = None  # kernel.apparmor_restrict_unprivileged_userns
    userns_clone: str | None = None  # kernel.unprivileged_userns_clone (Debian's old patch)
    max_user_namespaces: str | None = None  # user.max_user_namespaces
    seccomp: bool = False  # this process runs under a seccomp filter (Seccomp: 2)
    root: bool = False


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def read_policy() -> HostPolicy:
    status = _read("/proc/self/status") or ""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    filtered = fields.get("Seccomp", "").strip() == "2"
    return HostPolicy(
        _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
        _read("/proc/sys/kernel/unprivileged_userns_clone"),
        _read("/proc/sys/user/max_user_namespaces"),
        filtered,
        os.geteuid() == 0,
    )


def refused_namespaces(bwrap_said: str) -> bool:
    """Whether what bwrap wrote says the kernel refused it a namespace."""
    return any(mark in bwrap_said for mark in REFUSED_MARKS)


def hint(policy: HostPolicy) -> str:
    """What to do on this host so that a sandbox can be built (one or two sentences)."""
    if policy.seccomp:
        return (
            "namespaces are refused by a seccomp filter on the node (a container's default "
            "profile): run its container with --security-opt seccomp=unconfined (or a profile "
            "that allows unshare and clone with namespace flags), or run the node on the host"
        )
    if policy.max_user_namespaces == "0":
        return (
            "user namespaces are off (user.max_user_namespaces = 0): "
            "sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/ to keep it)"
        )
    if policy.apparmor_restrict == "1" and not policy.root:
        return (
            "AppArmor restricts unprivileged user namespaces (Ubuntu 23.10+): "
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (and in /etc/sysctl.d/), "
            "or run the node as root (strict mode needs no user namespace)"
        )
    if policy.userns_clone == "0" and not policy.root:
        return (
            "unprivileged user namespaces are off: sysctl -w kernel.unprivileged_userns_clone=1 "
            "(and in /etc/sysctl.d/), or run the node as root (strict mode needs none)"
        )
    return (
        "this host refuses the namespaces a sandbox needs: allow unprivileged user namespaces "
        "(sysctl), or run the node as root"
    )
