"""Limits of a job (config.toml ``[limits]``, ``[limits.<context id>]``): what they are, read once
at the start, and the rlimits that apply them. The reason a job that hit one ends with is read
from how it ended, with its outcome (node/slot/outcomes.py: :func:`limit_reason`).

The limits are applied as rlimits by the sandboxed worker (node/sandbox/inner.py) in each job's
process before the job's code runs; a job's children inherit them. What each limit means:

``processes``     RLIMIT_NPROC: processes (and threads) of the job's uid. Strict mode gives
                  each context its own uid, so the bound is per context; under ``namespaces``
                  the node's own user shares it (the node's processes are counted in).
``memory_mb``     RLIMIT_AS: address space of each process of the job.
``cpu_s``         RLIMIT_CPU: CPU seconds of each process (SIGXCPU, then SIGKILL a second on);
                  with cgroups, also the CPU seconds of the job's whole tree.
``open_files``    RLIMIT_NOFILE: open file descriptors per process.
``file_size_mb``  RLIMIT_FSIZE: the largest file a job may write (its output files included).
``disk_mb``       the context's work dir as a whole (node/sandbox/disk.py), where it has a
                  file system of its own; 0: no quota.
``cpu_percent``   the CPU share of a job's tree, in percent of one core (cgroups only).

Where the node has cgroups (node/sandbox/cgroups.py), ``memory_mb``, ``processes`` and
``cpu_s`` also bound each job's whole tree, and a job that hits one of those bounds ends with its
reason even if it printed nothing; RLIMIT_NPROC is then only a backstop for the context's uid as
a whole, and RLIMIT_CPU for each process.

Pure functions only: the node and the runner import this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace

MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    processes: int = 256
    memory_mb: int = 2048
    cpu_s: int = 3600
    open_files: int = 1024
    file_size_mb: int = 1024
    disk_mb: int = 1024
    cpu_percent: int = 100

    def to_json(self) -> dict[str, int]:
        return asdict(self)


LIMIT_NAMES = tuple(f.name for f in fields(Limits))


_ZERO_MEANS_NONE = ("disk_mb",)


class LimitsError(ValueError):
    """A [limits] table that cannot be used (its message says which entry)."""


def _check_values(where: str, table: Mapping[str, object]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in table.items():
        if name not in LIMIT_NAMES:
            known = ", ".join(LIMIT_NAMES)
            raise LimitsError(f"[{where}] {name}: unknown limit (known: {known})")
        low = 0 if name in _ZERO_MEANS_NONE else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise LimitsError(f"[{where}] {name}: a whole number >= {low} (got {value!r})")
        out[name] = value
    return out


def parse_limits(raw: object) -> dict[str, object]:
    """``[limits]`` checked, in its TOML shape: the defaults' entries and a sub-table per
    context id (``[limits.2]``) overriding any of them; LimitsError names a bad entry."""
    if not isinstance(raw, Mapping):
        raise LimitsError("[limits] must be a table")
    out: dict[str, object] = dict(_check_values("limits", _flat(raw)))
    for name, table in raw.items():
        if isinstance(table, Mapping):
            if not (str(name).isdigit() and int(name) >= 1):
                raise LimitsError(f"[limits.{name}]: a sub-table is named by a context id")
            out[str(int(name))] = _check_values(f"limits.{name}", table)
    return out


def _flat(table: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in table.items() if not isinstance(v, Mapping)}


def limits_for(table: Mapping[str, object], ctx: int) -> Limits:
    """The limits of context ``ctx``: its own entries over the defaults over the built-ins."""
    own = table.get(str(ctx), {})
    chosen = _flat(table) | (dict(own) if isinstance(own, Mapping) else {})
    return replace(Limits(), **chosen)


def raised(table: Mapping[str, object]) -> list[str]:
    """The bounds a context's own table sets above the node's (``[limits]`` over the
    built-ins), as "context 2: disk_mb 4096 (node: 1024)": said loudly at start."""
    base = limits_for(_flat(table), 0)
    out = []
    for name, own in sorted(table.items()):
        if isinstance(own, Mapping):
            for limit, value in sorted(own.items()):
                if value > getattr(base, limit) or (
                    limit == "disk_mb" and value == 0 < base.disk_mb
                ):
                    out.append(f"context {name}: {limit} {value} (node: {getattr(base, limit)})")
    return out


# (resource name in the ``resource`` module, soft value, hard value) per limit
def rlimits(
    limits: Limits, nproc_base: int = 0, tree_bound: bool = False
) -> list[tuple[str, int, int]]:
    """The rlimits a job's process sets on itself. ``nproc_base``: processes of the same uid
    that exist outside the job (the node's own, under ``namespaces``), added to the bound.
    ``tree_bound``: a cgroup bounds the job's processes; RLIMIT_NPROC (per uid, so per context
    in strict mode, shared by its slots) is then set twice as high, a backstop the cgroup's
    bound is reached before.
    CPU: the soft limit sends SIGXCPU (the reason is then certain), the hard one a second on
    kills a job that ignores it."""
    nproc = limits.processes * (2 if tree_bound else 1) + nproc_base
    return [
        ("RLIMIT_NPROC", nproc, nproc),
        ("RLIMIT_AS", limits.memory_mb * MB, limits.memory_mb * MB),
        ("RLIMIT_CPU", limits.cpu_s, limits.cpu_s + 1),
        ("RLIMIT_NOFILE", limits.open_files, limits.open_files),
        ("RLIMIT_FSIZE", limits.file_size_mb * MB, limits.file_size_mb * MB),
        ("RLIMIT_CORE", 0, 0),  # a core file would land in the work dir, and hold secrets
    ]
