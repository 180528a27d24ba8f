"""What the node tells a runner process at its start (node/worker/loop.py), and how: the first
frame on its stdin, before the control lines of the same pipe. The frame holds the ``runner``
URL with its password and the admission key, so it never travels in an environment, which any
process of the same uid could read in ``/proc/<pid>/environ`` and which children inherit.

It is the first clause of the slot's contract (node/slot/): the node writes it
(node/runners/processes.py), the runner process reads it (node/worker/loop.py).
"""

from __future__ import annotations

import json
import logging
import os
import struct
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from bus.core import keys

MAX_FRAME_BYTES = 1 << 20  # the spec frame on the pipe: a few hundred bytes in practice


@dataclass(frozen=True)
class RunnerSpec:
    """What one runner process serves and how (the first frame on its stdin: :func:`frame`)."""

    url: str
    ctx: int
    script_type: str
    slot: int
    command: list[str]
    group: str
    token_base: str
    lease_ttl_ms: int
    run_dir: str
    max_output_bytes: int
    reply_ttl_s: int
    node_id: str
    in_process: bool  # python jobs run in this interpreter (else: the command, a subprocess)
    max_jobs: int
    pop_timeout_s: float = 5.0  # a blocking pop's wait, after which every list is looked at
    # the type's circuit breaker (bus/store/atomic/type_breakers.py): failures in a row that open
    # it (0: none), for how long, and how many probes then go at once
    breaker_failures: int = 0
    breaker_open_ms: int = 10_000
    breaker_probes: int = 1
    taken_every: int = 16  # jobs taken between two reports to the node (its backpressure)
    # python jobs taken, run in one sandbox request and ended together, at most: only what is
    # queued when the slot takes (node/worker/batch.py; 1: one at a time)
    batch_jobs: int = 16
    log_level: int = logging.INFO
    # the node's (node/observe/logs.py FORMATS): its stderr stays one format
    log_format: str = "text"
    signer_fd: int = -1  # its socket to the node's signer (node/host/signer.py), inherited
    # the slot's sandbox (node/sandbox/spawn.py SandboxSpec, as a dict): no sandbox, no job
    sandbox: dict[str, Any] = field(default_factory=dict)
    # where its spans go, as its node's do (node/observe/tracing.py runner_settings; {}: off)
    tracing: dict[str, Any] = field(default_factory=dict)

    # fixed for the process's life: worked out once, plain attributes from then on (a log
    # line, a start, an end each read them; a property would run for each)
    @cached_property
    def slot_id(self) -> str:
        return f"{self.script_type}:{self.slot}"

    @cached_property
    def inflight(self) -> str:
        return keys.inflight(f"runner:{self.slot_id}")

    def token(self, job_key: str) -> str:
        """The fencing token this slot's start of ``job_key`` writes (its lease's value and the
        job's ``runner``); the scripts that start a taken entry build the same from
        ``token_base`` (runs_take_next, runs_start_moved)."""
        return f"{self.token_base}:{job_key}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def frame(spec: RunnerSpec, admission_key: bytes) -> bytes:
    """What the node writes first on a runner's stdin (4-byte length, JSON): its spec, with
    the ``runner`` URL and password, and the admission key. Control lines follow."""
    body = json.dumps({"spec": asdict(spec), "admission_key": admission_key.hex()}).encode()
    return struct.pack(">I", len(body)) + body


def read_frame(fd: int) -> tuple[RunnerSpec, bytes]:
    """The frame of :func:`frame`, read from ``fd`` byte-exactly (the control lines after it
    stay in the pipe for the watch thread)."""
    (size,) = struct.unpack(">I", _read_exactly(fd, 4))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"a runner frame of {size} bytes")
    raw = json.loads(_read_exactly(fd, size))
    return RunnerSpec(**raw["spec"]), bytes.fromhex(raw["admission_key"])


def _read_exactly(fd: int, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError("the node closed the pipe before the runner's spec")
        data += chunk
    return data
