"""hero-bus for trio programs: submit signed jobs to a node and await their results.

A client talks to its node's Redis (``hero-node status`` names it; ``hero-node credentials
client`` prints the URL of the client role of an embedded Valkey) and signs with an actor's key
(``hero-node init`` writes one, ``actor.key``, for actor 1 in context 1)::

    import trio
    from bus import new_job, open_client
    from crypto import read_key_file

    async def main(redis_url: str, actor_key: str) -> None:
        actor = read_key_file(actor_key)
        async with open_client(redis_url) as client:
            job = new_job(1, 1, "python", "print(6 * 7)")  # caller 1, context 1
            message = await client.submit(actor, 1, to="self", context_id=1, jobs=[job])
            [result] = await client.wait_results(message, timeout_s=30)
            print(result.status.value, result.stdout, end="")

    trio.run(main, "redis://127.0.0.1:6379", "actor.key")  # prints: finished 42

Every error raised here is a :class:`BusError`; signing keys and their errors come from
``crypto``.

The API: :func:`open_client` opens a :class:`Client` on a node's Redis; :func:`new_job` makes
a :class:`RunnerJob` for :meth:`Client.submit` (several jobs in one signed :class:`Message`) or
:meth:`Client.submit_many`, and :meth:`Client.submit_job` does both for one job;
:meth:`Client.wait_results` gives one :class:`JobResult` per job (a :class:`JobStatus`, the
``stdout``/``stderr``/``exit_code`` map and the ``reason`` of an error). Flows:
:meth:`Client.submit_flow` (a DAG document, checked before anything is stored: :class:`FlowError`),
:meth:`Client.wait_flow` and :meth:`Client.flow_state` (a :class:`FlowState` of
:class:`FlowJobState`, :class:`FlowStatus`). docs/use/client.md and
``examples/python_client.py`` show all of it.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from bus.core.models import FlowStatus, JobStatus, Message, RunnerJob
from bus.errors import (
    BusError,
    ClientError,
    ContentError,
    FrameError,
    HandshakeError,
    ModelError,
    StoreError,
    TransportError,
)

if TYPE_CHECKING:
    from bus.client.api import Client, JobResult, new_job, open_client
    from bus.core.dag import FlowError
    from bus.core.flows import FlowJobState, FlowState

# Loaded on first use: a runner process (node/worker/loop.py) uses the bus's keys, models and
# scripts without the async client and its imports (coredis, trio), which would cost each
# process a second of start-up, nor flows (their DAG checks and the crypto they verify with).
_LAZY = {
    "FlowJobState": "bus.core.flows",
    "FlowState": "bus.core.flows",
    "Client": "bus.client.api",
    "JobResult": "bus.client.api",
    "new_job": "bus.client.api",
    "open_client": "bus.client.api",
    "FlowError": "bus.core.dag",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'bus' has no attribute {name!r}")
    return getattr(import_module(_LAZY[name]), name)


__all__ = [
    "BusError",
    "Client",
    "ClientError",
    "ContentError",
    "FlowError",
    "FlowJobState",
    "FlowState",
    "FlowStatus",
    "FrameError",
    "HandshakeError",
    "JobResult",
    "JobStatus",
    "Message",
    "ModelError",
    "RunnerJob",
    "StoreError",
    "TransportError",
    "new_job",
    "open_client",
]
