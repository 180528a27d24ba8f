"""The actor-signed flow document, the flow-job payload, and flow state snapshots. Pure, no I/O.

Trust design (also in docs/use/flows.md):

* The **actor** signs the whole flow once, at submission, under domain ``flow``: a
  :class:`FlowDoc` holding every job's script, type, env, timeout, retries, target node (a
  resolved node id), context, prerequisites and its pre-assigned RunnerJob id, plus the flow's
  id, caller, origin node, creation time, expiry, a nonce and optionally its deadline. The
  client stores it (with the signature) in ``flow:<id>`` at the origin; the node never holds
  actor keys.
* When a job's prerequisites have finished, the **origin node** releases it as a message of type
  ``flow_job`` signed by the node's key (domain ``flow-job``). Its ``message`` field is a
  :class:`FlowJobPayload`: the actor-signed document with its signature, the flow-local job id
  and ``inputs`` (the prerequisites' result maps). The message carries the job with the env
  ``dag.merged_env(spec, job, inputs)``.
* The **destination** checks (node/flows/trust.py): the origin node's signature (a known node), the
  message's freshness and replay markers (fresh ``created_at``/nonce set at release); the
  actor's signature over the document against ``actor:<caller_id>`` registered *there*; that the
  document names this origin, has not expired and targets this node and context; that the job in
  the message is exactly the signed job with env rebuilt from the node-signed inputs; that the
  actor may execute in the context; and that this flow job was never materialised here by
  another message (``flowjob:<job key>`` claim). So a destination runs only scripts the actor
  signed, only for actors allowed in its context, with prerequisite data authenticated by the
  origin node, and each flow job at most once.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from bus.core import keys
from bus.core.codecs import loads_json
from bus.core.dag import FlowError, FlowJobSpec, FlowSpec, merged_env, parse_flow
from bus.core.errors import ModelError
from bus.core.models import FlowStatus, JobStatus, RunnerJob
from crypto import ALGORITHM_ED25519, Signer, Verdict, sign_object, verify_object

DOMAIN_FLOW = "flow"
DEFAULT_FLOW_TTL_S = 24 * 3600

_JSON = dict[str, Any]
_HEADER = ("id", "caller_id", "context_id", "created_at", "expires_at")


def _dump(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _job_dict(job: FlowJobSpec, job_id: int) -> _JSON:
    return {
        "id": job.id,
        "job_id": job_id,
        "node": job.node,
        "context_id": job.context_id,
        "script_type": job.script_type,
        "script": job.script,
        "env_vars": dict(job.env_vars),
        "timeout": job.timeout_s,
        "retries": job.retries,
        "depends": list(job.depends),
    }


@dataclass(frozen=True)
class FlowDoc:
    """What the actor signs: the flow, with node refs resolved and RunnerJob ids assigned."""

    id: int
    caller_id: int
    context_id: int
    origin: str
    created_at: int
    expires_at: int
    nonce: str
    spec: FlowSpec
    job_ids: dict[str, int] = field(default_factory=dict)
    # seconds after created_at by which the flow must be over (None: the origin node's
    # flow_deadline_s); signed, so no one but the actor can stretch it
    deadline_s: int | None = None
    # W3C trace context every job of the flow inherits (bus/core/tracecontext.py); signed
    # when set, judged by the origin node before it passes it on
    traceparent: str = ""
    tracestate: str = ""

    def __post_init__(self) -> None:
        _deadline_s(self.deadline_s)  # ModelError before anyone signs a bad one

    def to_dict(self) -> _JSON:
        return self._optional() | {
            "id": self.id,
            "caller_id": self.caller_id,
            "context_id": self.context_id,
            "origin": self.origin,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "nonce": self.nonce,
            "name": self.spec.name,
            "env_vars": dict(self.spec.env_vars),
            "jobs": [_job_dict(j, self.job_ids[j.id]) for j in self.spec.jobs],
        }

    def _optional(self) -> _JSON:
        """Signed fields present only when set: a document signed without them verifies
        unchanged."""
        optional: _JSON = {} if self.deadline_s is None else {"deadline_s": self.deadline_s}
        if self.traceparent:
            optional["traceparent"] = self.traceparent
        if self.tracestate:
            optional["tracestate"] = self.tracestate
        return optional

    def deadline(self, default_s: int) -> int:
        """When the flow must be over (wall-clock seconds): ``deadline_s`` (else ``default_s``)
        after its creation, and never after it expires (no job may be released then)."""
        relative = default_s if self.deadline_s is None else self.deadline_s
        return min(self.created_at + relative, self.expires_at)

    @classmethod
    def from_dict(cls, d: object) -> FlowDoc:
        """Parse a document; raises FlowError (bad shape) or ModelError (bad header)."""
        if not isinstance(d, dict) or not isinstance(d.get("jobs"), list):
            raise ModelError("a flow document must be an object with a list of jobs")
        jobs = [dict(j) if isinstance(j, dict) else j for j in d["jobs"]]
        job_ids = {str(j.get("id")): j.pop("job_id", None) for j in jobs if isinstance(j, dict)}
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in job_ids.values()):
            raise ModelError("every job of a flow document needs an integer job_id")
        spec = parse_flow(
            {"name": d.get("name", ""), "env_vars": d.get("env_vars", {}), "jobs": jobs}
        )
        try:
            header = {
                k: d[k] for k in ("id", "caller_id", "context_id", "created_at", "expires_at")
            }
            origin, nonce = str(d["origin"]), str(d["nonce"])
        except KeyError as exc:
            raise ModelError(f"flow document is missing {exc}") from None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in header.values()):
            raise ModelError("flow document header fields must be integers")
        deadline_s = _deadline_s(d.get("deadline_s"))
        trace = {k: d[k] for k in ("traceparent", "tracestate") if k in d}
        if not all(isinstance(v, str) for v in trace.values()):
            raise ModelError("flow document traceparent and tracestate must be strings")
        return cls(
            spec=spec,
            job_ids=job_ids,
            origin=origin,
            nonce=nonce,
            deadline_s=deadline_s,
            **header,
            **trace,
        )

    def job(self, job_id: str) -> FlowJobSpec:
        """The job with flow-local id ``job_id``; FlowError if there is none."""
        for job in self.spec.jobs:
            if job.id == job_id:
                return job
        raise FlowError(f"no job {job_id!r} in flow {self.id}", [job_id])

    def job_key(self, job_id: str) -> str:
        return keys.job(self.caller_id, self.job_ids[job_id])

    def runner_job(self, job_id: str, inputs: dict[str, dict[str, str]], stamp: int) -> RunnerJob:
        """The RunnerJob for ``job_id`` with prerequisite results ``inputs`` in its env."""
        job = self.job(job_id)
        return RunnerJob(
            id=self.job_ids[job_id],
            caller_id=self.caller_id,
            context_id=job.context_id,
            script=job.script,
            script_type=job.script_type,
            timeout=job.timeout_s,
            retries=job.retries,
            env_vars=merged_env(self.spec, job, inputs),
            created_at=stamp,
            updated_at=stamp,
        )


def _deadline_s(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**32:
        raise ModelError(f"flow document deadline_s must be a positive integer, not {value!r}")
    return value


def sign_flow(doc: FlowDoc, key: Signer) -> list[dict[str, str]]:
    """The actor's signature list over the document (domain ``flow``)."""
    return [sign_object(key, DOMAIN_FLOW, doc.to_dict())]


def verify_flow(
    doc: _JSON,
    signatures: object,
    expected_public_key: str,
    algorithm: str = ALGORITHM_ED25519,
    accepted: Collection[str] | None = None,
) -> Verdict:
    """Check that ``expected_public_key`` (of ``algorithm``, in ``accepted`` when given)
    signed the flow document ``doc``."""
    sigs = signatures if isinstance(signatures, list) else []
    return verify_object(
        sigs,
        DOMAIN_FLOW,
        doc,
        expected_public_key=expected_public_key,
        expected_algorithm=algorithm,
        accepted=accepted,
    )


@dataclass(frozen=True)
class FlowJobPayload:
    """The ``message`` field of a ``flow_job`` message (covered by the origin node's signature)."""

    flow: _JSON
    flow_signatures: list[dict[str, str]]
    job: str
    inputs: dict[str, dict[str, str]]

    def encode(self) -> str:
        return _dump(
            {
                "flow": self.flow,
                "flow_signatures": self.flow_signatures,
                "job": self.job,
                "inputs": self.inputs,
            }
        )

    @classmethod
    def decode(cls, text: str) -> FlowJobPayload:
        """Raises ModelError if ``text`` is not a well-formed payload."""
        try:
            d = loads_json(text)  # json.loads, at msgspec's speed
            flow, sigs, job, inputs = d["flow"], d["flow_signatures"], d["job"], d["inputs"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"malformed flow job payload: {exc}") from None
        ok_inputs = isinstance(inputs, dict) and all(
            isinstance(r, dict) and all(isinstance(v, str) for v in r.values())
            for r in inputs.values()
        )
        if not (isinstance(flow, dict) and isinstance(sigs, list) and isinstance(job, str)):
            raise ModelError("malformed flow job payload: wrong field types")
        if not ok_inputs:
            raise ModelError("malformed flow job payload: inputs must map ids to string maps")
        return cls(flow, sigs, job, inputs)


# -- state snapshots (what clients read) -------------------------------------------------------


@dataclass(frozen=True)
class FlowJobState:
    """One job of a flow as its origin node sees it: its flow-local ``id``, the node it runs
    on, its job key, prerequisites, status, error ``reason`` and result map."""

    id: str
    node: str
    job_key: str
    depends: tuple[str, ...]
    status: JobStatus
    reason: str = ""
    result: dict[str, str] = field(default_factory=dict)

    @property
    def stdout(self) -> str:
        return self.result.get("stdout", "")


@dataclass(frozen=True)
class FlowState:
    """A snapshot of a flow (:meth:`bus.Client.flow_state`): its status, its jobs (``job(id)``
    finds one) and, once over, ``result`` mapping each job id to its status and result."""

    id: int
    name: str
    status: FlowStatus
    reason: str
    jobs: tuple[FlowJobState, ...]
    result: dict[str, str] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.status in (FlowStatus.FINISHED, FlowStatus.ERROR)

    @property
    def ok(self) -> bool:
        return self.status is FlowStatus.FINISHED

    def job(self, job_id: str) -> FlowJobState:
        """KeyError if the flow has no such job."""
        for job in self.jobs:
            if job.id == job_id:
                return job
        raise KeyError(job_id)

    def signature(self) -> tuple[object, ...]:
        """What a live view compares to decide whether to redraw."""
        return (self.status, tuple((j.status, j.reason) for j in self.jobs))


def job_state(doc: FlowDoc, job: FlowJobSpec, fields: dict[str, str]) -> FlowJobState:
    """A job's snapshot from its origin copy's hash (missing hash: not released yet)."""
    try:
        status = JobStatus(fields.get("status", JobStatus.WAITING_FOR_PREREQUISITES.value))
    except ValueError:
        status = JobStatus.WAITING_FOR_PREREQUISITES
    raw = fields.get("result") or "{}"
    try:
        result = json.loads(raw)
    except ValueError:
        result = {}
    if not isinstance(result, dict):
        result = {}
    return FlowJobState(
        job.id,
        job.node,
        doc.job_key(job.id),
        job.depends,
        status,
        fields.get("reason", ""),
        {str(k): str(v) for k, v in result.items()},
    )
