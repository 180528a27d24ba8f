"""Which list a job is queued on, and which lists a runner slot consumes (pure functions).

A job is queued on the most specific queue it names (``bus.core.keys``)::

    queue:<type>                           no target (the plain, fast path)
    queue:<type>:group:<g>                 group g: any slot of that group
    queue:<type>:group:<g>:inst:<i>        instance i of group g (an instance needs a group)

each with a priority suffix: ``normal`` is the queue itself, ``high``/``low`` append
``:prio:high``/``:prio:low``. A slot of group g, instance i (its slot number) consumes its
instance, then its group, then the type queue; a slot without a group only the type queue.
Priorities come first: every high list before any normal one before any low one, except that
every ``AGING_EVERY``-th pop of a slot serves the lowest non-empty priority first, so a stream
of high-priority jobs cannot starve low ones (a low job waits at most AGING_EVERY pops of its
slots).

A runner process pops with ``runs_pop_first`` over these lists and, when all are empty, blocks
on the type queue alone (the plain, busiest list): BLMPOP waits on many lists but loses the
entry if the process dies between its pop and the in-flight push, and Lua cannot block. A job
that this node queues on another list (a priority or targeted one) while its runners idle
interrupts their wait (``WakeUps.wake_idle_slots``); one queued there by another process
(an operator's ``dlq retry``) is taken at the next wake-up: the next job on the type queue, or
the pop timeout (node/worker/loop.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from bus.core import keys
from bus.core.models import RunnerJob

AGING_EVERY = 8


def target_queue(job: RunnerJob) -> str:
    """The list materialisation pushes ``job`` on (its type, group, instance, priority)."""
    return queue_for(job.script_type, job.group, job.instance, job.priority)


def queue_for(script_type: str, group: str = "", instance: str = "", priority: str = "") -> str:
    """The list a job with these targeting fields is pushed on (unknown priority: normal)."""
    if group and instance:
        base = keys.queue_instance(script_type, group, instance)
    elif group:
        base = keys.queue_group(script_type, group)
    else:
        base = keys.queue(script_type)
    return keys.queue_prio(base, priority if priority in keys.PRIORITIES else "normal")


def queue_of(fields: Mapping[str, str]) -> str:
    """:func:`target_queue` of a job hash (or a job's signed dict as strings)."""
    return queue_for(
        fields.get("script_type", ""),
        fields.get("group", ""),
        fields.get("instance", ""),
        fields.get("priority", ""),
    )


def slot_bases(script_type: str, group: str = "", instance: str = "") -> list[str]:
    """The base queues of a slot, most specific first."""
    if not group:
        return [keys.queue(script_type)]
    return [
        keys.queue_instance(script_type, group, instance),
        keys.queue_group(script_type, group),
        keys.queue(script_type),
    ]


def consume_order(bases: list[str], pop_number: int = 1) -> list[str]:
    """Every list a slot consumes, in the order of its ``pop_number``-th pop (1-based):
    priority first, then specificity; on every AGING_EVERY-th pop, lowest priority first."""
    prios = list(keys.PRIORITIES)
    if pop_number % AGING_EVERY == 0:
        prios.reverse()
    return [keys.queue_prio(base, p) for p in prios for base in bases]
