"""The sandbox's command line, planned from plain facts (no I/O here: :mod:`.probe` gathers the
facts, :mod:`.host` starts what is planned).

Three ways to start a sandboxed worker, by isolation mode:

``strict`` as root: bwrap, privileged, makes the namespaces and the empty root, keeps only
    CAP_SETUID/SETGID/SETPCAP for the worker's first program, ``setpriv``, which becomes the
    context's uid and gid, clears the supplementary groups, every capability set, and sets
    no_new_privs before it executes the worker.
``strict`` with only CAP_SETUID and CAP_SETGID (the systemd unit): ``setpriv`` first, outside,
    then bwrap in a new user namespace as the context's uid (the work dir passed as an open
    directory, as that uid cannot reach it through the 0700 home).
``namespaces``: bwrap in a new user namespace, same uid as the node, every capability dropped.

Every mode: new pid, ipc, uts, cgroup (and, unless the context may use it, network)
namespaces, ``--die-with-parent``, ``--new-session``, a cleared environment, an empty root with
read-only binds of the system's /usr (and its /bin, /lib... links), a few files of /etc and the
interpreter; /tmp a tmpfs; the context's work dir, the one writable place, at /work; the
seccomp filter (node/sandbox/seccomp.py) on fd :data:`SECCOMP_FD`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

MODES = ("auto", "strict", "namespaces", "none")
WORK = "/job"  # where the job's work dir is inside the sandbox (its HOME and cwd)
SECCOMP_FD = 3
WORKDIR_FD = 4  # strict without root: the work dir as an open directory
PATH = "/usr/local/bin:/usr/bin:/bin"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# enough of /etc for the dynamic loader, the shell and the tools in /usr (alternatives)
ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
    "/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",
)  # fmt: skip
NET_ETC_FILES = ("/etc/resolv.conf", "/etc/hosts", "/etc/ssl", "/etc/ca-certificates")
SETPRIV_DROP = ("--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs")


class PlanError(ValueError):
    """A sandbox that must not be built (what it would expose is named)."""


@dataclass(frozen=True)
class HostFacts:
    """What the planner needs to know of the host: which system dirs exist, and which are
    symbolic links (to what), as on merged-/usr systems."""

    dirs: dict[str, str | None]  # existing path -> its link target, or None if a directory


@dataclass(frozen=True)
class SandboxPlan:
    mode: str  # "strict" or "namespaces"
    bwrap: str
    setpriv: str
    work_dir: str  # the host path of the context's work dir
    worker: Sequence[str]  # the sandboxed program and its arguments
    binds: Sequence[str]  # host paths bound read-only at the same place
    uid: int = -1  # strict: the context's uid (and gid)
    network: bool = False
    as_root: bool = True  # strict: the node is root (else: it has CAP_SETUID/SETGID only)
    seccomp_fd: int = SECCOMP_FD
    workdir_fd: int = WORKDIR_FD
    tmp_bytes: int = 64 * 1024 * 1024
    env: dict[str, str] = field(default_factory=dict)


def collapse(paths: Iterable[str]) -> list[str]:
    """``paths`` without those inside another one (a bind covers what is under it)."""
    unique = sorted({str(PurePath(p)) for p in paths}, key=len)
    out: list[str] = []
    for p in unique:
        if not any(PurePath(p).is_relative_to(q) for q in out):
            out.append(p)
    return sorted(out)


def check_binds(binds: Iterable[str], secret_dirs: Iterable[str]) -> None:
    """PlanError if a bind is ``/`` or would expose a secret dir (the node's home): one that
    contains it or is inside it."""
    for b in binds:
        if PurePath(b) == PurePath("/"):
            raise PlanError("the sandbox never binds / (it would expose the node's home)")
        for s in secret_dirs:
            if PurePath(s).is_relative_to(b):  # a home inside the code jobs run with
                raise PlanError(
                    f"binding {b} into the sandbox would expose {s}: give the node a home "
                    f"outside {b} (--home, $HERO_NODE_HOME)"
                )
            if PurePath(b).is_relative_to(s):
                raise PlanError(
                    f"binding {b} into the sandbox would expose {s}: install the node's python "
                    "and its virtualenv outside the node's home"
                )


def python_binds(executable: str, prefixes: Iterable[str], package_root: str) -> list[str]:
    """What the worker's interpreter needs: its prefixes (the virtualenv and the Python it was
    made from), the directory holding the project's packages, the executable's own dir."""
    return collapse([str(PurePath(executable).parent), *prefixes, package_root])


def system_ops(facts: HostFacts, extra: Iterable[str]) -> list[str]:
    """bwrap arguments for the system dirs (a link is recreated, a dir bound read-only) and
    the ``extra`` files and dirs that exist (``--ro-bind-try``)."""
    ops: list[str] = []
    for d in SYSTEM_DIRS:
        if d not in facts.dirs:
            continue
        target = facts.dirs[d]
        ops += ["--symlink", target, d] if target is not None else ["--ro-bind", d, d]
    for path in extra:
        ops += ["--ro-bind-try", path, path]
    return ops


def parent_dirs(binds: Iterable[str]) -> list[str]:
    """The dirs leading to each bind, made 0755 (bwrap would make them 0700, which a strict
    job's uid could not traverse)."""
    made: list[str] = []
    for b in binds:
        for parent in reversed(PurePath(b).parents[:-1]):
            if str(parent) not in made:
                made.append(str(parent))
    return [arg for d in made for arg in ("--perms", "0755", "--dir", d)]


def environment(plan: SandboxPlan) -> list[str]:
    env = {"PATH": PATH, "HOME": WORK, "LANG": "C.UTF-8"} | dict(plan.env)
    out = ["--clearenv"]
    for name, value in env.items():
        out += ["--setenv", name, value]
    return out


def bwrap_argv(plan: SandboxPlan, facts: HostFacts) -> list[str]:
    """The full command line that starts the sandboxed worker of ``plan``."""
    if plan.mode not in ("strict", "namespaces"):
        raise PlanError(f"no sandbox in mode {plan.mode!r}")
    userns = plan.mode == "namespaces" or not plan.as_root
    argv = [plan.bwrap, "--die-with-parent", "--new-session"]
    if userns:
        argv += ["--unshare-user", "--disable-userns"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not plan.network:
        argv += ["--unshare-net"]
    argv += ["--hostname", "hero-job"]
    argv += environment(plan)
    etc = ETC_FILES + (NET_ETC_FILES if plan.network else ())
    argv += ["--perms", "0755", "--dir", "/etc", *system_ops(facts, etc)]
    # /tmp first: a bind below it (a project or virtualenv checked out under /tmp) must be
    # mounted on top of the tmpfs, not hidden by it
    argv += ["--size", str(plan.tmp_bytes), "--perms", "01777", "--tmpfs", "/tmp"]
    argv += parent_dirs(plan.binds)
    for b in plan.binds:
        argv += ["--ro-bind", b, b]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if plan.mode == "strict" and not plan.as_root:
        argv += ["--bind-fd", str(plan.workdir_fd), WORK]
    else:
        argv += ["--bind", plan.work_dir, WORK]
    argv += ["--chdir", WORK, "--seccomp", str(plan.seccomp_fd)]
    if plan.mode == "strict" and plan.as_root:
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"):
            argv += ["--cap-add", cap]
        argv += ["--", *setpriv_argv(plan), "--", *plan.worker]
        return argv
    argv += ["--cap-drop", "ALL"] if plan.as_root else []
    argv += ["--", *plan.worker]
    if plan.mode == "strict":  # not root: become the context's uid first, then bwrap
        return [*setpriv_argv(plan), "--", *argv]
    if not plan.as_root and plan.setpriv:
        # a node with capabilities (the systemd unit's) passes them on as ambient ones, and
        # bwrap, not setuid, refuses to start with any: they are dropped before it
        return [plan.setpriv, "--inh-caps=-all", "--ambient-caps=-all", "--", *argv]
    return argv


def setpriv_argv(plan: SandboxPlan) -> list[str]:
    ids = [f"--reuid={plan.uid}", f"--regid={plan.uid}"]
    return [plan.setpriv, *ids, *SETPRIV_DROP]


def context_uid(base: int, ctx: int) -> int:
    """The uid (and gid) of context ``ctx``'s jobs in strict mode."""
    return base + ctx


def resolve_mode(setting: str, can_switch: bool, works: dict[str, str]) -> tuple[str, str]:
    """The mode to run in and why, from the setting, whether the node may switch users, and
    the probe's verdict per mode (``works[mode]``: "" if a sandbox of that mode starts, else
    why not). Mode "refused": jobs do not run; the reason says why."""
    if setting == "none":
        return "none", 'isolation = "none": jobs run without a sandbox, as the node\'s user'
    if setting == "strict":
        if not can_switch:
            return "refused", "strict needs root or CAP_SETUID+CAP_SETGID to switch users"
        why = works.get("strict", "not probed")
        return (
            ("strict", "per-context uid, namespaces, seccomp")
            if not why
            else ("refused", f"strict sandbox unusable: {why}")
        )
    if setting == "namespaces":
        why = works.get("namespaces", "not probed")
        return (
            ("namespaces", "same uid, namespaces, seccomp")
            if not why
            else ("refused", f"namespaces sandbox unusable: {why}")
        )
    # auto
    if can_switch and not works.get("strict", "not probed"):
        return "strict", "auto: the node can switch users (per-context uid, namespaces, seccomp)"
    if not works.get("namespaces", "not probed"):
        return "namespaces", "auto: the node cannot switch users (same uid, namespaces, seccomp)"
    whys = "; ".join(f"{m}: {w}" for m, w in works.items() if w)
    return "refused", f'no sandbox can be built ({whys}); set isolation = "none" to run anyway'
