"""bus.core.dag: flow parsing, graph validation, environment merging and the pure scheduler."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.core.dag import (
    Decision,
    FlowError,
    FlowJobSpec,
    FlowSpec,
    flow_result,
    merged_env,
    parse_flow,
    schedule,
    validate_flow,
)
from bus.core.models import FlowStatus, JobStatus
from bus.errors import BusError

F, E = JobStatus.FINISHED, JobStatus.ERROR


def job(jid: str, *depends: str, node: str = "n1", **kw: object) -> FlowJobSpec:
    return FlowJobSpec(
        id=jid,
        node=node,
        context_id=1,
        script_type="sh",
        script=f"echo {jid}",
        depends=depends,
        **kw,  # type: ignore[arg-type]
    )


def flow(*jobs: FlowJobSpec, **env: str) -> FlowSpec:
    return FlowSpec(jobs=jobs, env_vars=dict(env))


DOC: dict[str, object] = {
    "name": "build",
    "env_vars": {"STAGE": "ci"},
    "jobs": [
        {"id": "A", "node": "n1", "context": 7, "type": "sh", "script": "echo a"},
        {
            "id": "B",
            "node": "n2",
            "context": 7,
            "type": "python",
            "script": "print(1)",
            "env": {"X": "1"},
            "timeout": 5,
            "retries": 2,
            "depends": ["A"],
        },
    ],
}


# -- parse_flow --------------------------------------------------------------------------------


def test_parse_flow_reads_every_field_and_defaults() -> None:
    spec = parse_flow(DOC)
    assert spec.name == "build"
    assert spec.env_vars == {"STAGE": "ci"}
    a, b = spec.jobs
    assert a == FlowJobSpec("A", "n1", 7, "sh", "echo a")
    assert (a.timeout_s, a.retries, a.depends, a.env_vars) == (60, 0, (), {})
    assert b == FlowJobSpec("B", "n2", 7, "python", "print(1)", {"X": "1"}, 5, 2, ("A",))


def test_parse_flow_accepts_aliases_and_the_spec_misspelling() -> None:
    doc = copy.deepcopy(DOC)
    b = doc["jobs"][1]  # type: ignore[index]
    for old, new in [
        ("context", "context_id"),
        ("type", "script_type"),
        ("env", "env_vars"),
        ("timeout", "timeout_s"),
        ("depends", "dependends"),
    ]:
        b[new] = b.pop(old)
    assert parse_flow(doc) == parse_flow(DOC)


def test_parse_flow_minimal_document_and_zero_timeout() -> None:
    spec = parse_flow({"jobs": [{**DOC["jobs"][0], "timeout": 0}]})  # type: ignore[index]
    assert spec.name == ""
    assert spec.env_vars == {}
    assert spec.jobs[0].timeout_s == 0  # 0 means "no limit" to the executor


def _broken(field: str, value: object) -> dict[str, object]:
    doc = copy.deepcopy(DOC)
    b = doc["jobs"][1]  # type: ignore[index]
    if value is ...:
        del b[field]
    else:
        b[field] = value
    return doc


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("node", ..., ["'node'", "missing"]),
        ("script", ..., ["'script'", "missing"]),
        ("context", ..., ["'context'", "missing"]),
        ("type", ..., ["'type'", "missing"]),
        ("node", 3, ["'node'", "string"]),
        ("node", "", ["'node'", "empty"]),
        ("context", "7", ["'context'", "integer"]),
        ("context", True, ["'context'", "integer"]),
        ("context", -1, ["'context'", "negative"]),
        ("timeout", -5, ["'timeout'", "negative"]),
        ("timeout", 1.5, ["'timeout'", "integer"]),
        ("timeout_s", -1, ["'timeout", "given twice"]),
        ("retries", 256, ["'retries'", "at most 255"]),
        ("env", {"X": 1}, ["'env'", "'X'", "string"]),
        ("env", ["X=1"], ["'env'", "object"]),
        ("depends", "A", ["'depends'", "list"]),
        ("depends", ["A", 2], ["'depends'", "2"]),
        ("depends", ["A", "A"], ["'depends'", "more than once"]),
        ("dependson", ["A"], ["unknown field", "dependson"]),
    ],
)
def test_parse_flow_errors_name_job_and_field(field: str, value: object, words: list[str]) -> None:
    with pytest.raises(FlowError) as info:
        parse_flow(_broken(field, value))
    assert info.value.jobs == ["B"]
    assert "'B'" in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_parse_flow_error_names_the_alias_actually_used() -> None:
    doc = _broken("timeout", ...)
    doc["jobs"][1]["timeout_s"] = -3  # type: ignore[index]
    with pytest.raises(FlowError, match="job 'B' field 'timeout_s' must not be negative"):
        parse_flow(doc)


@pytest.mark.parametrize("bad_id", ["", "a b", "x" * 65, "é", "a/b", 5, None])
def test_parse_flow_rejects_bad_ids(bad_id: object) -> None:
    with pytest.raises(FlowError, match="job #1 field 'id'") as info:
        parse_flow(_broken("id", bad_id))
    assert isinstance(info.value, BusError)


def test_parse_flow_rejects_missing_id_and_bad_shapes() -> None:
    with pytest.raises(FlowError, match="job #1 is missing field 'id'"):
        parse_flow(_broken("id", ...))
    with pytest.raises(FlowError, match="flow must be an object"):
        parse_flow([DOC])
    with pytest.raises(FlowError, match="'jobs' is missing"):
        parse_flow({"name": "x"})
    with pytest.raises(FlowError, match="'jobs' must not be empty"):
        parse_flow({"jobs": []})
    with pytest.raises(FlowError, match="job #0 must be an object"):
        parse_flow({"jobs": ["A"]})
    with pytest.raises(FlowError, match="flow field 'env_vars'"):
        parse_flow({**DOC, "env_vars": {"A": None}})
    with pytest.raises(FlowError, match="unknown field.*owner"):
        parse_flow({**DOC, "owner": 1})


def test_parse_flow_does_not_check_the_graph() -> None:
    spec = parse_flow(_broken("depends", ["nope"]))
    with pytest.raises(FlowError, match="unknown dependency"):
        validate_flow(spec)


# -- validate_flow -----------------------------------------------------------------------------


def test_topological_order_is_kahn_with_spec_order_ties() -> None:
    spec = flow(job("D", "B", "C"), job("C", "A"), job("B", "A"), job("A"), job("Z"))
    # always the earliest job in the spec whose prerequisites are all placed
    assert validate_flow(spec) == ["A", "C", "B", "D", "Z"]
    assert validate_flow(flow(job("x"), job("y"), job("w"))) == ["x", "y", "w"]


def _flow_error(spec: FlowSpec, known: list[str] | None = None) -> FlowError:
    with pytest.raises(FlowError) as info:
        validate_flow(spec, known)
    return info.value


def test_two_cycle() -> None:
    err = _flow_error(flow(job("A", "B"), job("B", "A"), job("C", "A")))
    assert err.jobs == ["A", "B"]  # C sits downstream of the cycle but is not on it
    assert "cycle: A -> B -> A" in str(err)


def test_three_cycle_is_reported_as_a_path() -> None:
    err = _flow_error(flow(job("S"), job("A", "S", "C"), job("B", "A"), job("C", "B")))
    assert err.jobs == ["A", "B", "C"]
    assert "cycle: A -> C -> B -> A" in str(err)


def test_two_separate_cycles_are_both_named() -> None:
    err = _flow_error(flow(job("A", "B"), job("B", "A"), job("X", "Y"), job("Y", "X")))
    assert err.jobs == ["A", "B", "X", "Y"]
    assert "A -> B -> A" in str(err)
    assert "X -> Y -> X" in str(err)


def test_self_loop() -> None:
    err = _flow_error(flow(job("A"), job("B", "A", "B"), job("C", "C")))
    assert err.jobs == ["B", "C"]
    assert "themselves" in str(err)


def test_unknown_dependency_names_every_offender() -> None:
    err = _flow_error(flow(job("A", "ghost"), job("B", "A"), job("C", "spook")))
    assert err.jobs == ["A", "C"]
    assert "'ghost'" in str(err)
    assert "'spook'" in str(err)


def test_duplicate_ids_win_over_later_checks() -> None:
    err = _flow_error(flow(job("A"), job("B", "A"), job("A", "B"), job("B")), known=[])
    assert err.jobs == ["A", "B"]
    assert "duplicate" in str(err)


def test_bad_id_in_a_hand_built_spec() -> None:
    err = _flow_error(flow(job("ok"), job("not ok")))
    assert err.jobs == ["not ok"]


def test_unknown_node() -> None:
    spec = flow(job("A", node="n1"), job("B", node="n9"), job("C", node="n8"))
    err = _flow_error(spec, ["n1", "n2"])
    assert err.jobs == ["B", "C"]
    assert "'n9'" in str(err)
    assert "'n8'" in str(err)
    assert validate_flow(spec) == ["A", "B", "C"]  # nodes unchecked without known_nodes


def test_prerequisites_sharing_an_env_name_are_rejected() -> None:
    err = _flow_error(flow(job("a-b"), job("A_B"), job("C", "a-b", "A_B")))
    assert err.jobs == ["a-b", "A_B", "C"]
    assert "HERO_DEP_A_B_STDOUT" in str(err)
    validate_flow(flow(job("a-b"), job("A_B"), job("C", "a-b"), job("D", "A_B")))


# -- schedule ----------------------------------------------------------------------------------

DIAMOND = flow(job("A"), job("B", "A"), job("C", "A"), job("D", "B", "C"))


def test_diamond_happy_path() -> None:
    s: dict[str, JobStatus] = {}
    assert schedule(DIAMOND, s) == Decision(("A",), (), FlowStatus.DISPATCHED, False)
    s["A"] = JobStatus.DISPATCHED
    assert schedule(DIAMOND, s) == Decision((), (), FlowStatus.STARTED, False)
    s["A"] = F
    assert schedule(DIAMOND, s).ready == ("B", "C")
    s |= {"B": F, "C": JobStatus.STARTED}
    assert schedule(DIAMOND, s) == Decision((), (), FlowStatus.STARTED, False)
    s["C"] = F
    s["D"] = JobStatus.WAITING_FOR_PREREQUISITES  # counts as not dispatched
    assert schedule(DIAMOND, s) == Decision(("D",), (), FlowStatus.STARTED, False)
    s["D"] = F
    assert schedule(DIAMOND, s) == Decision((), (), FlowStatus.FINISHED, True)


def test_diamond_failure_dooms_descendants_after_siblings_finish() -> None:
    s = {"A": F, "B": JobStatus.STARTED, "C": E}
    assert schedule(DIAMOND, s) == Decision((), ("D",), FlowStatus.STARTED, False)
    s["D"] = E  # the engine marks the doomed job
    assert schedule(DIAMOND, s) == Decision((), (), FlowStatus.STARTED, False)
    s["B"] = F
    assert schedule(DIAMOND, s) == Decision((), (), FlowStatus.ERROR, True)


def test_doomed_counts_as_error_for_done_and_status() -> None:
    d = schedule(DIAMOND, {"A": F, "B": F, "C": E})
    assert d == Decision((), ("D",), FlowStatus.ERROR, True)


def test_failure_dooms_transitively_but_spares_independent_branches() -> None:
    spec = flow(job("A"), job("B", "A"), job("C", "B"), job("X"), job("Y", "X"))
    d = schedule(spec, {"A": E, "X": F})
    assert d == Decision(("Y",), ("B", "C"), FlowStatus.STARTED, False)


def test_in_flight_descendant_of_a_failure_is_doomed() -> None:
    d = schedule(DIAMOND, {"A": E, "B": JobStatus.STARTED})
    assert d.doomed == ("B", "C", "D")
    assert d.done
    assert d.flow_status == FlowStatus.ERROR


def test_schedule_accepts_plain_status_strings() -> None:
    assert schedule(DIAMOND, {"A": "finished"}).ready == ("B", "C")  # type: ignore[dict-item]


def test_schedule_rejects_unknown_jobs_statuses_and_bad_specs() -> None:
    with pytest.raises(FlowError, match="not in the flow: Q") as info:
        schedule(DIAMOND, {"Q": F})
    assert info.value.jobs == ["Q"]
    with pytest.raises(FlowError, match="unknown status 'done'"):
        schedule(DIAMOND, {"A": "done"})  # type: ignore[dict-item]
    with pytest.raises(FlowError, match="cycle"):
        schedule(flow(job("A", "B"), job("B", "A")), {})


# -- merged_env and flow_result ----------------------------------------------------------------


def test_merged_env_precedence_and_dependency_results() -> None:
    spec = flow(
        job("build-1"),
        job("t.2"),
        job("D", "build-1", "t.2", env_vars={"X": "job", "HERO_DEPS_JSON": "mine"}),
        X="flow",
        Y="flow",
        HERO_DEP_T_2_STDOUT="flow",
    )
    results = {
        "build-1": {"stdout": "built\n\n", "exit_code": "0"},
        "t.2": {"stdout": "ok", "stderr": "w"},
        "D": {"stdout": "ignored"},
    }
    env = merged_env(spec, spec.jobs[2], results)
    assert env["X"] == "job"
    assert env["Y"] == "flow"
    assert env["HERO_DEP_BUILD_1_STDOUT"] == "built"
    assert env["HERO_DEP_T_2_STDOUT"] == "ok"
    deps = json.loads(env["HERO_DEPS_JSON"])
    assert deps == {"build-1": results["build-1"], "t.2": results["t.2"]}
    assert list(deps) == sorted(deps)
    assert set(env) == {
        "X",
        "Y",
        "HERO_DEP_BUILD_1_STDOUT",
        "HERO_DEP_T_2_STDOUT",
        "HERO_DEPS_JSON",
    }


def test_merged_env_without_prerequisites_or_results() -> None:
    spec = flow(job("A", env_vars={"K": "v"}), job("B", "A"), K="flow")
    assert merged_env(spec, spec.jobs[0], {}) == {"K": "v", "HERO_DEPS_JSON": "{}"}
    env = merged_env(spec, spec.jobs[1], {})
    assert env["HERO_DEP_A_STDOUT"] == ""
    assert json.loads(env["HERO_DEPS_JSON"]) == {"A": {}}


def test_flow_result() -> None:
    out = flow_result(DIAMOND, {"A": {"stdout": "a"}, "C": {"stderr": "x"}}, {"A": F, "C": E})
    assert list(out) == ["A", "B", "C", "D"]
    assert json.loads(out["A"]) == {"status": "finished", "result": {"stdout": "a"}}
    assert json.loads(out["C"]) == {"status": "error", "result": {"stderr": "x"}}
    assert json.loads(out["D"]) == {"status": "waiting_for_prerequisites", "result": {}}
    with pytest.raises(FlowError, match="result given for job"):
        flow_result(DIAMOND, {"Z": {}}, {})


# -- properties over random DAGs ---------------------------------------------------------------


@st.composite
def dags(draw: st.DrawFn, min_size: int = 1) -> FlowSpec:
    """n <= 12 jobs; job i depends only on jobs < i; listed in a random order."""
    n = draw(st.integers(min_size, 12))
    deps = [draw(st.sets(st.integers(0, i - 1), max_size=4)) if i else set() for i in range(n)]
    order = draw(st.permutations(range(n)))
    return flow(*(job(f"j{i}", *(f"j{d}" for d in sorted(deps[i]))) for i in order))


def descendants(spec: FlowSpec, roots: set[str]) -> set[str]:
    children: dict[str, set[str]] = {j.id: set() for j in spec.jobs}
    for j in spec.jobs:
        for d in j.depends:
            children[d].add(j.id)
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        for c in children[stack.pop()]:
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return seen


@given(dags())
def test_topological_order_respects_dependencies(spec: FlowSpec) -> None:
    order = validate_flow(spec)
    assert sorted(order) == sorted(j.id for j in spec.jobs)
    pos = {jid: i for i, jid in enumerate(order)}
    assert all(pos[d] < pos[j.id] for j in spec.jobs for d in j.depends)
    assert validate_flow(spec) == order


@settings(max_examples=300)
@given(dags(), st.lists(st.booleans(), min_size=12, max_size=12))
def test_simulated_scheduler_loop(spec: FlowSpec, fails: list[bool]) -> None:
    n = len(spec.jobs)
    deps = {j.id: j.depends for j in spec.jobs}
    order = validate_flow(spec)
    states: dict[str, JobStatus] = {}
    self_errored: set[str] = set()
    doomed_all: set[str] = set()
    rounds = 0
    while True:
        d = schedule(spec, states)
        rounds += 1
        assert rounds <= n + 1
        assert not set(d.ready) & set(d.doomed)
        assert list(d.ready) == sorted(d.ready, key=order.index)
        for jid in d.ready:
            assert all(states.get(p) == F for p in deps[jid])
        errored = {jid for jid, status in states.items() if status == E}
        unfinal = {j.id for j in spec.jobs if j.id not in states}
        assert set(d.doomed) == descendants(spec, errored) & unfinal  # all at once, transitively
        if not d.done:
            assert d.flow_status == (FlowStatus.DISPATCHED if not states else FlowStatus.STARTED)
            assert d.ready or d.doomed  # progress every round
        for jid in d.doomed:
            assert jid not in doomed_all
            doomed_all.add(jid)
            states[jid] = E
        for jid in d.ready:
            states[jid] = E if fails[int(jid[1:])] else F
            if states[jid] == E:
                self_errored.add(jid)
        if d.done:  # the last decision may still carry doomed jobs to mark, never ready ones
            assert not d.ready
            break
    assert all(states[j.id].final for j in spec.jobs)
    assert doomed_all == descendants(spec, self_errored)
    assert (d.flow_status == FlowStatus.FINISHED) == (not self_errored)
    assert d.flow_status in (FlowStatus.FINISHED, FlowStatus.ERROR)
    assert schedule(spec, states) == Decision((), (), d.flow_status, True)
    result = flow_result(spec, {}, states)
    assert {k: json.loads(v)["status"] for k, v in result.items()} == states


def _reachable(edges: Mapping[str, tuple[str, ...]], start: str) -> set[str]:
    seen, stack = {start}, [start]
    while stack:
        for nxt in edges[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


@given(dags(min_size=2), st.randoms(use_true_random=False))
def test_back_edge_cycle_is_named(spec: FlowSpec, rnd: random.Random) -> None:
    ups = {j.id: j.depends for j in spec.jobs}
    pairs = [(lo, hi) for hi in ups for lo in _reachable(ups, hi) - {hi}]
    if not pairs:  # no dependency at all: add one so there is something to close
        a, b = spec.jobs[0].id, spec.jobs[1].id
        spec = flow(*(job(j.id, *((a,) if j.id == b else j.depends)) for j in spec.jobs))
        ups = {j.id: j.depends for j in spec.jobs}
        pairs = [(a, b)]
    lo, hi = rnd.choice(pairs)  # hi depends (transitively) on lo; make lo depend on hi
    cyclic = flow(*(job(j.id, *j.depends, *((hi,) if j.id == lo else ())) for j in spec.jobs))
    with pytest.raises(FlowError, match="cycle: ") as info:
        validate_flow(cyclic)
    downs: dict[str, tuple[str, ...]] = {j.id: () for j in spec.jobs}
    for j in spec.jobs:
        for dep in j.depends:
            downs[dep] += (j.id,)
    on_cycle = _reachable(ups, hi) & _reachable(downs, lo)  # every lo -> ... -> hi path
    assert set(info.value.jobs) == on_cycle
    assert {lo, hi} <= set(info.value.jobs)
