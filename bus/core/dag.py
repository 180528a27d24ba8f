"""Flows as DAGs of jobs: parsing, validation and the pure scheduling decision.

A flow is a set of jobs, possibly on several nodes, where a job may list prerequisites
(``depends``) by their flow-local id. The origin node releases a job only once all its
prerequisites finished; a job whose prerequisite (transitively) ended in error can never run
and is *doomed*: it must end in error with reason ``prerequisite_failed``. Independent branches
keep running after a failure elsewhere.

Everything here is pure (no I/O, no trio, no Redis): the flow engine reads the job statuses,
calls :func:`schedule` and carries out the returned :class:`Decision`.

Job statuses as seen by :func:`schedule`: a job missing from ``states`` or in
``waiting_for_prerequisites`` has not been dispatched yet; ``dispatched`` and ``started`` are
in flight; ``finished`` and ``error`` are final.
"""

from __future__ import annotations

import json
import re
from collections import Counter, deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from bus.core.errors import FlowError
from bus.core.models import FlowStatus, JobStatus
from bus.core.reasons import Reason

JOB_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
DOOMED_REASON = Reason.PREREQUISITE_FAILED
DEPS_JSON_VAR = "HERO_DEPS_JSON"
_MAX_U32 = 2**32 - 1
_MAX_RETRIES = 255  # u8 in the spec
_NOT_DISPATCHED = (None, JobStatus.WAITING_FOR_PREREQUISITES)


@dataclass(frozen=True)
class FlowJobSpec:
    """One job of a flow; ``id`` is flow-local and ``depends`` lists prerequisite ids."""

    id: str
    node: str
    context_id: int
    script_type: str
    script: str
    env_vars: dict[str, str] = field(default_factory=dict)
    timeout_s: int = 60
    retries: int = 0
    depends: tuple[str, ...] = ()


@dataclass(frozen=True)
class FlowSpec:
    jobs: tuple[FlowJobSpec, ...]
    env_vars: dict[str, str] = field(default_factory=dict)
    name: str = ""


@dataclass(frozen=True)
class Decision:
    """What the flow engine must do now (see :func:`schedule`).

    ``done`` may come together with a non-empty ``doomed``: mark those jobs in error first.
    ``ready`` is always empty when ``done`` is true.
    """

    ready: tuple[str, ...]
    doomed: tuple[str, ...]
    flow_status: FlowStatus
    done: bool


# -- parsing -----------------------------------------------------------------------------------

# canonical field -> accepted keys in a job object (first one is the documented name)
_JOB_KEYS: dict[str, tuple[str, ...]] = {
    "id": ("id",),
    "node": ("node",),
    "context_id": ("context", "context_id"),
    "script_type": ("type", "script_type"),
    "script": ("script",),
    "env_vars": ("env", "env_vars"),
    "timeout_s": ("timeout", "timeout_s"),
    "retries": ("retries",),
    "depends": ("depends", "dependends"),
}
_FLOW_KEYS: dict[str, tuple[str, ...]] = {
    "name": ("name",),
    "env_vars": ("env_vars", "env"),
    "jobs": ("jobs",),
}
_MISSING = object()
_Field = tuple[str, object]


def _where(job: str | None, key: str) -> str:
    return f"job {job!r} field {key!r}" if job is not None else f"flow field {key!r}"


def _pick(doc: Mapping[str, object], aliases: tuple[str, ...], job: str | None) -> _Field:
    """(key used, value) under whichever alias is present; FlowError if several are."""
    present = [k for k in aliases if k in doc]
    if len(present) > 1:
        raise _fail(job, present[0], f"given twice (as {' and '.join(present)})")
    return (present[0], doc[present[0]]) if present else (aliases[0], _MISSING)


def _check_keys(
    doc: Mapping[str, object], table: Mapping[str, tuple[str, ...]], job: str | None
) -> None:
    allowed = {k for aliases in table.values() for k in aliases}
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        what = f"job {job!r}" if job is not None else "flow"
        raise FlowError(f"{what} has unknown field(s) {', '.join(unknown)}", [job] if job else [])


def _fail(job: str | None, key: str, problem: str) -> FlowError:
    return FlowError(f"{_where(job, key)} {problem}", [job] if job else [])


def _str(value: object, job: str | None, key: str, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise _fail(job, key, f"must be a string, got {type(value).__name__}")
    if not empty and not value:
        raise _fail(job, key, "must not be empty")
    return value


def _uint(value: object, job: str | None, key: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(job, key, f"must be an integer, got {type(value).__name__}")
    if value < 0:
        raise _fail(job, key, f"must not be negative, got {value}")
    if value > maximum:
        raise _fail(job, key, f"must be at most {maximum}, got {value}")
    return value


def _env(value: object, job: str | None, key: str) -> dict[str, str]:
    if value is _MISSING:
        return {}
    if not isinstance(value, dict):
        raise _fail(job, key, f"must be an object of strings, got {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(k, str) or not k:
            raise _fail(job, key, f"has an invalid variable name {k!r}")
        if not isinstance(v, str):
            raise _fail(job, key, f"variable {k!r} must be a string, got {type(v).__name__}")
    return dict(value)


def _depends(value: object, job: str, key: str) -> tuple[str, ...]:
    if value is _MISSING:
        return ()
    if not isinstance(value, list):
        raise _fail(job, key, f"must be a list of job ids, got {type(value).__name__}")
    for dep in value:
        if not isinstance(dep, str):
            raise _fail(job, key, f"must hold job ids (strings), got {dep!r}")
    dupes = sorted({d for d in value if value.count(d) > 1})
    if dupes:
        raise _fail(job, key, f"lists {', '.join(dupes)} more than once")
    return tuple(value)


def _job_id(doc: Mapping[str, object], index: int) -> str:
    raw = doc.get("id", _MISSING)
    label = f"#{index}"
    if raw is _MISSING:
        raise FlowError(f"job {label} is missing field 'id'", [label])
    if not isinstance(raw, str) or not JOB_ID_RE.fullmatch(raw):
        raise FlowError(
            f"job {label} field 'id' is {raw!r}: expected 1..64 chars of [A-Za-z0-9_.-]",
            [label if not isinstance(raw, str) else raw],
        )
    return raw


def _parse_job(doc: object, index: int) -> FlowJobSpec:
    if not isinstance(doc, dict):
        raise FlowError(f"job #{index} must be an object, got {type(doc).__name__}", [f"#{index}"])
    jid = _job_id(doc, index)
    _check_keys(doc, _JOB_KEYS, jid)
    f = {name: _pick(doc, aliases, jid) for name, aliases in _JOB_KEYS.items()}
    for key, value in (f["node"], f["context_id"], f["script_type"], f["script"]):
        if value is _MISSING:
            raise _fail(jid, key, "is missing")
    (timeout_key, timeout), (retries_key, retries) = f["timeout_s"], f["retries"]
    return FlowJobSpec(
        id=jid,
        node=_str(f["node"][1], jid, f["node"][0], empty=False),
        context_id=_uint(f["context_id"][1], jid, f["context_id"][0], _MAX_U32),
        script_type=_str(f["script_type"][1], jid, f["script_type"][0], empty=False),
        script=_str(f["script"][1], jid, f["script"][0]),
        env_vars=_env(f["env_vars"][1], jid, f["env_vars"][0]),
        timeout_s=60 if timeout is _MISSING else _uint(timeout, jid, timeout_key, _MAX_U32),
        retries=0 if retries is _MISSING else _uint(retries, jid, retries_key, _MAX_RETRIES),
        depends=_depends(f["depends"][1], jid, f["depends"][0]),
    )


def parse_flow(doc: object) -> FlowSpec:
    """Build a :class:`FlowSpec` from a parsed JSON/YAML document.

    Only the shape is checked here (types, missing fields, ids, ranges); the graph is checked
    by :func:`validate_flow`. Raises :class:`FlowError` naming the job and field at fault.
    """
    if not isinstance(doc, dict):
        raise FlowError(f"a flow must be an object, got {type(doc).__name__}")
    _check_keys(doc, _FLOW_KEYS, None)
    (_, name), (env_key, env), (_, jobs) = (_pick(doc, a, None) for a in _FLOW_KEYS.values())
    if jobs is _MISSING:
        raise _fail(None, "jobs", "is missing")
    if not isinstance(jobs, list):
        raise _fail(None, "jobs", f"must be a list, got {type(jobs).__name__}")
    if not jobs:
        raise _fail(None, "jobs", "must not be empty")
    return FlowSpec(
        jobs=tuple(_parse_job(j, i) for i, j in enumerate(jobs)),
        env_vars=_env(env, None, env_key),
        name="" if name is _MISSING else _str(name, None, "name"),
    )


# -- validation --------------------------------------------------------------------------------


def dep_env_name(job_id: str) -> str:
    """``HERO_DEP_<ID>_STDOUT`` for a prerequisite id (upper-cased, non-alnum -> ``_``)."""
    return "HERO_DEP_" + re.sub(r"[^A-Z0-9]", "_", job_id.upper()) + "_STDOUT"


def _ordered(spec: FlowSpec, ids: Iterable[str]) -> list[str]:
    wanted = set(ids)
    seen: list[str] = []
    for job in spec.jobs:
        if job.id in wanted and job.id not in seen:
            seen.append(job.id)
    return seen


def _check_ids(spec: FlowSpec) -> None:
    bad = [j.id for j in spec.jobs if not JOB_ID_RE.fullmatch(j.id)]
    if bad:
        raise FlowError(f"invalid job id(s): {', '.join(map(repr, bad))}", bad)
    counts = Counter(j.id for j in spec.jobs)
    dupes = [jid for jid, n in counts.items() if n > 1]
    if dupes:
        raise FlowError(f"duplicate job id(s): {', '.join(dupes)}", dupes)


def _check_edges(spec: FlowSpec) -> None:
    ids = {j.id for j in spec.jobs}
    unknown = [(j.id, d) for j in spec.jobs for d in j.depends if d not in ids]
    if unknown:
        detail = "; ".join(f"{j} depends on unknown job {d!r}" for j, d in unknown)
        raise FlowError(f"unknown dependency: {detail}", _ordered(spec, [j for j, _ in unknown]))
    selfish = [j.id for j in spec.jobs if j.id in j.depends]
    if selfish:
        raise FlowError(f"job(s) depending on themselves: {', '.join(selfish)}", selfish)


def _kahn(spec: FlowSpec) -> list[str]:
    """Topological order (prerequisites first), ties broken by spec order; partial on cycles."""
    position = {j.id: i for i, j in enumerate(spec.jobs)}
    pending = {j.id: len(set(j.depends)) for j in spec.jobs}
    children: dict[str, list[str]] = {j.id: [] for j in spec.jobs}
    for job in spec.jobs:
        for dep in set(job.depends):
            children[dep].append(job.id)
    ready = sorted((jid for jid, n in pending.items() if n == 0), key=position.__getitem__)
    order: list[str] = []
    while ready:
        jid = ready.pop(0)
        order.append(jid)
        for child in children[jid]:
            pending[child] -= 1
            if pending[child] == 0:
                ready.append(child)
        ready.sort(key=position.__getitem__)
    return order


def _reaches(edges: Mapping[str, Iterable[str]], start: str, within: Collection[str]) -> set[str]:
    seen = {start}
    stack = [start]
    while stack:
        for nxt in edges[stack.pop()]:
            if nxt in within and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _cycle_path(deps: Mapping[str, tuple[str, ...]], members: set[str], start: str) -> list[str]:
    """Shortest ``start -> ... -> start`` path along depends edges inside one cycle component."""
    parent: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        cur = queue.popleft()
        for nxt in deps[cur]:
            if nxt == start:
                path = [start]
                node: str | None = cur
                while node is not None:
                    path.append(node)
                    node = parent[node]
                return path[::-1]
            if nxt in members and nxt not in parent:
                parent[nxt] = cur
                queue.append(nxt)
    raise AssertionError(f"{start} is not on a cycle")  # pragma: no cover


def _check_cycles(spec: FlowSpec, order: list[str]) -> None:
    """Raise FlowError naming every job that lies on a cycle (with one cycle per component)."""
    placed = set(order)
    stuck = [j.id for j in spec.jobs if j.id not in placed]
    if not stuck:
        return
    deps = {j.id: j.depends for j in spec.jobs}
    rdeps: dict[str, list[str]] = {j.id: [] for j in spec.jobs}
    for job in spec.jobs:
        for dep in job.depends:
            rdeps[dep].append(job.id)
    on_cycle: list[str] = []
    paths: list[str] = []
    for jid in stuck:
        if jid in on_cycle:
            continue
        component = _reaches(deps, jid, stuck) & _reaches(rdeps, jid, stuck)
        if len(component) > 1:  # else jid merely sits downstream of a cycle
            on_cycle.extend(_ordered(spec, component))
            paths.append(" -> ".join(_cycle_path(deps, component, jid)))
    on_cycle = _ordered(spec, on_cycle)
    raise FlowError(f"cycle: {'; '.join(paths)} (X -> Y: X depends on Y)", on_cycle)


def _check_env_names(spec: FlowSpec) -> None:
    clashes: list[str] = []
    details: list[str] = []
    for job in spec.jobs:
        by_name: dict[str, list[str]] = {}
        for dep in job.depends:
            by_name.setdefault(dep_env_name(dep), []).append(dep)
        for name, deps in by_name.items():
            if len(deps) > 1:
                clashes += [job.id, *deps]
                details.append(f"{job.id}: {' and '.join(deps)} both give {name}")
    if clashes:
        raise FlowError(
            f"ambiguous prerequisite variables: {'; '.join(details)}", _ordered(spec, clashes)
        )


def validate_flow(spec: FlowSpec, known_nodes: Collection[str] | None = None) -> list[str]:
    """Check the flow's graph and return its job ids in topological order.

    The order is Kahn's algorithm with ties broken by spec order: each step takes the earliest
    job in the spec whose prerequisites are all placed. Checks, in order: job ids
    well-formed, no duplicate ids, no unknown dependency, no self-dependency, no cycle, no two
    prerequisites of one job sharing a ``HERO_DEP_*`` name, and (if ``known_nodes`` is given)
    every node known. Raises :class:`FlowError` naming all offending jobs of the first failing
    check; a cycle is reported with the jobs on it, e.g. ``cycle: A -> B -> A``.
    """
    _check_ids(spec)
    _check_edges(spec)
    order = _kahn(spec)
    _check_cycles(spec, order)
    _check_env_names(spec)
    if known_nodes is not None:
        strays = [j for j in spec.jobs if j.node not in known_nodes]
        if strays:
            detail = ", ".join(f"{j.id} (node {j.node!r})" for j in strays)
            raise FlowError(f"unknown node for job(s): {detail}", [j.id for j in strays])
    return order


# -- environment -------------------------------------------------------------------------------


def merged_env(
    spec: FlowSpec, job: FlowJobSpec, results: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """The environment ``job`` runs with: flow env < job env < prerequisite results.

    For each direct prerequisite P: ``HERO_DEP_<P>_STDOUT`` holds P's ``stdout`` with trailing
    newlines stripped (as shell ``$(...)`` does), and ``HERO_DEPS_JSON`` is a JSON object
    ``{P: result map}`` with sorted keys. A prerequisite without a result counts as an empty
    result map. Raises nothing.
    """
    env = dict(spec.env_vars) | dict(job.env_vars)
    deps: dict[str, dict[str, str]] = {}
    for dep in job.depends:
        result = dict(results.get(dep, {}))
        deps[dep] = result
        env[dep_env_name(dep)] = result.get("stdout", "").rstrip("\n")
    env[DEPS_JSON_VAR] = json.dumps(deps, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return env


# -- scheduling --------------------------------------------------------------------------------


def _check_ids_known(spec: FlowSpec, given: Iterable[str], what: str) -> None:
    ids = {j.id for j in spec.jobs}
    strays = sorted(k for k in given if k not in ids)
    if strays:
        raise FlowError(f"{what} given for job(s) not in the flow: {', '.join(strays)}", strays)


def _statuses(spec: FlowSpec, states: Mapping[str, JobStatus | str]) -> dict[str, JobStatus]:
    """``states`` checked against the flow, with plain strings turned into JobStatus."""
    _check_ids_known(spec, states, "status")
    out: dict[str, JobStatus] = {}
    for jid, status in states.items():
        try:
            out[jid] = JobStatus(status)
        except ValueError:
            raise FlowError(f"job {jid!r} has unknown status {status!r}", [jid]) from None
    return out


def _doomed(spec: FlowSpec, order: list[str], states: Mapping[str, JobStatus]) -> set[str]:
    """Not-yet-final jobs with an errored prerequisite, transitively."""
    deps = {j.id: j.depends for j in spec.jobs}
    tainted: set[str] = set()  # jobs with an ERROR job among their ancestors
    for jid in order:
        if any(states.get(d) == JobStatus.ERROR or d in tainted for d in deps[jid]):
            tainted.add(jid)
    return {jid for jid in tainted if not _final(states.get(jid))}


def _final(status: JobStatus | None) -> bool:
    return status is not None and status.final


def _flow_status(spec: FlowSpec, states: Mapping[str, JobStatus], doomed: set[str]) -> FlowStatus:
    ended = [JobStatus.ERROR if j.id in doomed else states.get(j.id) for j in spec.jobs]
    if all(s == JobStatus.FINISHED for s in ended):
        return FlowStatus.FINISHED
    if all(_final(s) for s in ended):
        return FlowStatus.ERROR
    if any(states.get(j.id) not in _NOT_DISPATCHED for j in spec.jobs):
        return FlowStatus.STARTED
    return FlowStatus.DISPATCHED


def schedule(spec: FlowSpec, states: Mapping[str, JobStatus]) -> Decision:
    """Decide which jobs to dispatch now and which can never run.

    ``states`` maps job id to its current status; a missing job has not been dispatched. A job
    is *ready* when it has not been dispatched (missing or ``waiting_for_prerequisites``), all
    its direct prerequisites are ``finished`` and it is not doomed. A job is *doomed* when it is
    not final and a prerequisite, transitively, is ``error``; the engine must set it to
    ``error`` with reason :data:`DOOMED_REASON`. Both tuples are in topological order.

    Flow status: ``finished`` when every job finished; ``error`` when every job is final
    (doomed counted as error) and one errored; ``started`` once any job was dispatched;
    else ``dispatched``. ``done`` is true once every job is final (doomed counted as error).
    Raises :class:`FlowError` if the spec is invalid (see :func:`validate_flow`) or ``states``
    names a job that is not in the flow or holds an unknown status.
    """
    order = validate_flow(spec)
    states = _statuses(spec, states)
    deps = {j.id: j.depends for j in spec.jobs}
    doomed = _doomed(spec, order, states)
    ready = tuple(
        jid
        for jid in order
        if states.get(jid) in _NOT_DISPATCHED
        and jid not in doomed
        and all(states.get(d) == JobStatus.FINISHED for d in deps[jid])
    )
    status = _flow_status(spec, states, doomed)
    done = all(_final(states.get(j.id)) or j.id in doomed for j in spec.jobs)
    return Decision(
        ready=ready,
        doomed=tuple(jid for jid in order if jid in doomed),
        flow_status=status,
        done=done,
    )


def flow_result(
    spec: FlowSpec,
    results: Mapping[str, Mapping[str, str]],
    states: Mapping[str, JobStatus],
) -> dict[str, str]:
    """The flow's ``result`` map: job id -> JSON ``{"status": ..., "result": {...}}``.

    A job missing from ``states`` is reported as ``waiting_for_prerequisites`` and one missing
    from ``results`` with an empty result. Raises :class:`FlowError` if ``results`` or
    ``states`` names a job that is not in the flow.
    """
    states = _statuses(spec, states)
    _check_ids_known(spec, results, "result")
    out: dict[str, str] = {}
    for job in spec.jobs:
        status = states.get(job.id, JobStatus.WAITING_FOR_PREREQUISITES)
        entry = {"status": status.value, "result": dict(results.get(job.id, {}))}
        out[job.id] = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return out
