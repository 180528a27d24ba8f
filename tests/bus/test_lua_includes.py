"""How bus/store/atomic composes a script from its Lua files (``-- include:`` lines): each
fragment is placed once per script, however many of its parts include it."""

from __future__ import annotations

import re
from importlib import resources

from bus.store.atomic import CONSTANTS, source
from bus.store.atomic.runs import ENDS, ends_then_source, then_source

_LUA = resources.files("bus.store.atomic").joinpath("lua")
_INCLUDE = re.compile(r"^-- include: ([a-z0-9_]+)$", re.MULTILINE)


def _names() -> list[str]:
    return sorted(p.name[:-4] for p in _LUA.iterdir() if p.name.endswith(".lua"))


def _fragments() -> dict[str, str]:
    """Each included fragment by name, with the first line it is placed with (its header)."""
    names = {n for name in _names() for n in _INCLUDE.findall(_text(name))}
    return {n: _text(n).split("\n")[0] for n in sorted(names)}


def _text(name: str) -> str:
    text = _LUA.joinpath(f"{name}.lua").read_text("utf-8")
    return re.sub(r"\$\{([A-Z_]+)\}", lambda m: CONSTANTS[m.group(1)], text)


def test_a_fragment_included_by_several_parts_of_a_script_is_placed_once() -> None:
    fragments = _fragments()
    assert "chunked" in fragments
    for name in _names():
        text = source(name)
        assert not _INCLUDE.search(text), name
        for fragment, header in fragments.items():
            assert text.count(header) <= 1, (name, fragment)
    # queues_materialise includes chunked itself and through inflight_ack and quota_depth
    assert source("queues_materialise").count("local function call_chunked(") == 1
    # runs_finish_local includes stats_jobs itself and through runs_answer_here
    assert source("runs_finish_local").count(fragments["stats_jobs"]) == 1


def test_the_runner_scripts_place_their_shared_fragments_once_above_every_part() -> None:
    """A batch's ends and the take after them share one copy of the fragments that collect
    a batch's writes (runs_pushes, runs_leases, runs_inflight and what they include), so that
    the flush after the ends writes what every end collected."""
    fragments = _fragments()
    shared = ("stats_jobs", "runs_inflight", "inflight_ack", "runs_pushes", "runs_leases")
    for text in [ends_then_source(), *(then_source(end, "runs_take_next") for end in ENDS)]:
        for fragment in (*shared, "chunked", "batch_entry"):
            assert text.count(fragments[fragment]) == 1, fragment
