"""The ``[commands]`` and ``[runner_groups]`` tables of config.toml, checked when the config is
read: script type names, command templates and their placeholders (what the placeholders do
when a job runs: node/slot/commands.py)."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

from node.errors import ConfigError

SCRIPT_FILE = "{script_file}"
PLACEHOLDERS = frozenset({"script_file", "job_id", "caller_id", "context_id", "script_type"})
FIELD_PATTERN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_TYPE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

# The built-in script types: the script goes on the interpreter's stdin.
BUILTIN_COMMANDS: dict[str, list[str]] = {
    "python": [sys.executable, "-u", "-"],
    "sh": ["/bin/sh", "-s"],
}


def validate_commands(raw: object, runners: Mapping[str, int]) -> dict[str, list[str]]:
    """Check the ``[commands]`` table against ``[runners]``; the commands as a plain dict.

    Raises ConfigError naming the offending entry: a template that is not a non-empty list of
    strings, an unknown placeholder, a bad type name, a type configured in one table only.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError("[commands] must map a script type to a command (a list of strings)")
    out: dict[str, list[str]] = {}
    for script_type, template in raw.items():
        if not _TYPE.match(str(script_type)):
            raise ConfigError(f"[commands] {script_type!r}: use letters, digits, '_', '-', '.'")
        out[str(script_type)] = validate_template(str(script_type), template)
        if script_type not in runners:
            raise ConfigError(
                f"[commands] {script_type} has no concurrency: add `{script_type} = 1` to [runners]"
            )
    missing = sorted(
        t for t, n in runners.items() if n > 0 and t not in out and t not in BUILTIN_COMMANDS
    )
    if missing:
        raise ConfigError(
            f"[runners] {', '.join(missing)}: no command to run it; built in are "
            f"{', '.join(sorted(BUILTIN_COMMANDS))}, others need a [commands] entry"
        )
    return out


def validate_groups(raw: object, runners: Mapping[str, int]) -> dict[str, str]:
    """Check ``[runner_groups]`` (script type -> group name of this node's slots of that type);
    ConfigError for a type without runners or a group name that is not a plain word."""
    if not isinstance(raw, Mapping):
        raise ConfigError("[runner_groups] must map a script type to a group name")
    for script_type, group in raw.items():
        if script_type not in runners:
            raise ConfigError(f"[runner_groups] {script_type}: no such type in [runners]")
        if not isinstance(group, str) or not _TYPE.match(group):
            raise ConfigError(
                f"[runner_groups] {script_type}: a group name is letters, digits, '_', '-', '.'"
            )
    return {str(k): str(v) for k, v in raw.items()}


def validate_template(script_type: str, template: object) -> list[str]:
    """``template`` as a list of strings; ConfigError if it is empty, not a list of strings, or
    uses a placeholder that does not exist."""
    if (
        not isinstance(template, list)
        or not template
        or not all(isinstance(a, str) for a in template)
        or not template[0]
    ):
        raise ConfigError(
            f"[commands] {script_type}: a command is a non-empty list of strings, "
            f'e.g. {script_type} = ["{script_type}", "run", "{{script_file}}"]'
        )
    for arg in template:
        for match in FIELD_PATTERN.finditer(arg):
            name = match.group(1)
            if name is not None and name not in PLACEHOLDERS:
                raise ConfigError(
                    f"[commands] {script_type}: unknown placeholder {{{name}}} in {arg!r} "
                    f"(known: {', '.join('{' + p + '}' for p in sorted(PLACEHOLDERS))})"
                )
    return list(template)
