"""How read commands print: a table for people, or one stable JSON document with ``--json``.

Every ``--json`` output is a single JSON value on stdout (an object, or a list for the ``list``
commands), with the field names docs/use/cli.md documents; timestamps are unix seconds,
never formatted dates (integers, except in a hash printed as stored, whose values are all
strings).
"""

from __future__ import annotations

import argparse
import json
import time

JSON_HELP = "print one JSON document instead of text (shapes: docs/use/cli.md)"


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
