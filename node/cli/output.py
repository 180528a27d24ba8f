"""How read commands print: a table for people, or one stable JSON document with ``--json``.

Every ``--json`` output is a single JSON value on stdout (an object, or a list for the ``list``
commands) that validates against its command's JSON Schema, ``node/cli/schemas/<command>.json``
(``job-list.json`` for ``job list``; docs/use/json-output.md explains them). Values are typed:
numbers and times (unix seconds) are integers, flags booleans, and what the node stores as text
is converted here, once, by the helpers below; only the ``show`` commands print a hash as stored
(every value a string), since they show the record itself.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

JSON_HELP = "print one JSON document instead of text (its schema: node/cli/schemas/)"
SCHEMAS = Path(__file__).resolve().parent / "schemas"


def schema_path(command: str) -> Path:
    """The JSON Schema of ``command``'s ``--json`` output (``job list``: job-list.json;
    hero-verify's ``hero-verify verify``: hero-verify-verify.json)."""
    return SCHEMAS / f"{command.replace(' ', '-')}.json"


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help=JSON_HELP)


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def stamp(seconds: object) -> str:
    """A unix time as local ``YYYY-MM-DD HH:MM:SS`` ("-" for none or 0)."""
    try:
        value = int(str(seconds))
    except ValueError:
        return str(seconds)
    if value <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))


def ago(seconds: object, now: float) -> str:
    """How long before ``now`` a unix time was, as ``12s``, ``5m``, ``3h``, ``2d`` ("never")."""
    try:
        value = int(str(seconds))
    except ValueError:
        return "?"
    if value <= 0:
        return "never"
    delta = max(0, int(now) - value)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{delta // size}{unit} ago"
    return f"{delta}s ago"


def integer(value: object) -> int | None:
    """A stored number (text) as an int; None for none ("", absent or not a number)."""
    try:
        return int(str(value))
    except ValueError:
        return None


def job_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """A job's result map (stdout, stderr, exit_code, attempts, as carried: strings) typed:
    ``exit_code`` an int or None (killed, timed out, never ran), ``attempts`` an int; other
    keys (an external runner's) as given."""
    out = dict(result)
    if "exit_code" in out:
        out["exit_code"] = integer(out["exit_code"])
    if "attempts" in out:
        out["attempts"] = integer(out["attempts"]) or 0
    return out


def flow_results(result: Mapping[str, str]) -> dict[str, Any]:
    """A flow's ``result`` (job id -> its JSON text ``{status, result}``) parsed and typed; a
    value that is not such JSON is kept as ``{"status": "", "result": {}, "raw": text}``."""
    out: dict[str, Any] = {}
    for job_id, text in result.items():
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            value = None
        if not isinstance(value, dict):
            out[job_id] = {"status": "", "result": {}, "raw": str(text)}
            continue
        inner = value.get("result")
        out[job_id] = {
            "status": str(value.get("status", "")),
            "result": job_result(inner if isinstance(inner, dict) else {}),
        }
    return out


# node:info's fields that are not text: numbers, and "0"/"1" flags
_NODE_INTEGERS = ("pid", "started_at")
_NODE_FLAGS = ("dumpable", "signer_dumpable")


def node_facts(info: Mapping[str, str]) -> dict[str, Any]:
    """The node's published facts (``node:info``) typed for ``status --json``."""
    out: dict[str, Any] = dict(info)
    for name in _NODE_INTEGERS:
        if name in out:
            out[name] = integer(out[name]) or 0
    for name in _NODE_FLAGS:
        if name in out:
            out[name] = out[name] == "1"
    return out
