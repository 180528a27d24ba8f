"""The long-lived processes' heap: what start-up made is kept out of the collector's full passes.

CPython's cyclic collector walks every tracked object in a full (oldest generation) pass. A node
holds ~90,000 of them once it is up (modules, classes, functions, its services), nearly all of
them for its lifetime, and one such pass took 40-50 ms here: a pause in which no message moves,
which the round trips that meet it show as their p99. :func:`freeze_start_heap` collects once
and then freezes what is left (``gc.freeze``: a permanent generation no pass walks), so later
passes walk only what was made since. What start-up made and later drops in a reference cycle is
not reclaimed; start-up makes few such objects, and only the process entry points (``hero-node
run``, a runner process) call it, never a library user's process.
"""

from __future__ import annotations

import gc


def freeze_start_heap() -> int:
    """Collect, then move every object tracked now out of reach of later collections; returns
    how many are frozen (for the start-up log)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
