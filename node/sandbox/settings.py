"""The ``[sandbox]`` table of config.toml: the bwrap to use, how many jobs a warm sandboxed
worker runs before it is replaced, whether each job gets a fresh process in it, and per
context (``[sandbox.<context id>]``) whether its jobs may use the network, and its own
recycling (1: a fresh sandbox for every job) and ``fresh_process``.

    [sandbox]
    bwrap = "bwrap"        # a name looked up in PATH, or a path
    recycle_jobs = 10000
    fresh_process = false  # python jobs of a context share a warm process (node/sandbox/inner.py)
    work_dir = "keep"      # or "per_job": the work dir emptied after each job, as /tmp is
    [sandbox.2]
    network = true
    recycle_jobs = 1
    fresh_process = true   # no job of context 2 runs in a process an earlier job ran in
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_BWRAP = "bwrap"
# A worker runs no job's code (its job process does, and is replaced after CPU_BUDGET_S of CPU
# or anything a job left in it: node/sandbox/inner.py), and what a job leaves in the sandbox is
# killed or emptied after each job: a new sandbox every 1,000 jobs a slot cost ~0.06 ms of CPU
# per local job (a start ~38 ms), 10,000 ~0.006 (bench/HISTORY.md#job-process-cpu)
DEFAULT_RECYCLE_JOBS = 10_000
_TOP = {"bwrap": str, "recycle_jobs": int, "fresh_process": bool, "work_dir": str}
_PER_CONTEXT = {"network": bool, "recycle_jobs": int, "fresh_process": bool, "work_dir": str}
WORK_DIR_POLICIES = ("keep", "per_job")


class SandboxSettingsError(ValueError):
    """A [sandbox] entry that cannot be used (the message says which)."""


def _check(where: str, table: Mapping[str, object], kinds: Mapping[str, type]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in table.items():
        kind = kinds.get(name)
        if kind is None:
            raise SandboxSettingsError(f"[{where}] {name}: unknown (known: {', '.join(kinds)})")
        ok = isinstance(value, kind) and (kind is not int or not isinstance(value, bool))
        if not ok or (kind is int and value < 1):  # type: ignore[operator]
            raise SandboxSettingsError(f"[{where}] {name}: a {kind.__name__} (got {value!r})")
        if name == "work_dir" and value not in WORK_DIR_POLICIES:
            raise SandboxSettingsError(f'[{where}] work_dir: "keep" or "per_job" (got {value!r})')
        out[name] = value
    return out


def parse_sandbox(raw: object) -> dict[str, object]:
    """``[sandbox]`` checked, in its TOML shape."""
    if not isinstance(raw, Mapping):
        raise SandboxSettingsError("[sandbox] must be a table")
    flat = {k: v for k, v in raw.items() if not isinstance(v, Mapping)}
    out = _check("sandbox", flat, _TOP)
    for name, table in raw.items():
        if isinstance(table, Mapping):
            if not (str(name).isdigit() and int(name) >= 1):
                why = "a sub-table is named by a context id"
                raise SandboxSettingsError(f"[sandbox.{name}]: {why}")
            out[str(int(name))] = _check(f"sandbox.{name}", table, _PER_CONTEXT)
    return out


def bwrap_of(table: Mapping[str, object]) -> str:
    return str(table.get("bwrap", DEFAULT_BWRAP))


@dataclass(frozen=True)
class ContextSandbox:
    """A context's own sandbox settings."""

    network: bool = False
    recycle_jobs: int = DEFAULT_RECYCLE_JOBS
    fresh_process: bool = False
    work_dir: str = "keep"


def context_settings(table: Mapping[str, object], ctx: int) -> ContextSandbox:
    """Context ``ctx``'s settings: its own entries over ``[sandbox]``'s over the defaults."""
    own = table.get(str(ctx), {})
    own = own if isinstance(own, Mapping) else {}
    recycle = own.get("recycle_jobs", table.get("recycle_jobs", DEFAULT_RECYCLE_JOBS))
    fresh = own.get("fresh_process", table.get("fresh_process", False))
    work_dir = str(own.get("work_dir", table.get("work_dir", "keep")))
    return ContextSandbox(bool(own.get("network", False)), int(recycle), bool(fresh), work_dir)
