"""Script types and the commands that run them: the built-ins plus ``[commands]`` of config.toml.

A command is a template: a non-empty list of strings, the program and its arguments. These
placeholders are replaced in every argument (plain text replacement, no other ``{...}`` is
allowed, so a literal brace needs no escaping except ``{{``/``}}`` for ``{``/``}``):

``{script_file}``  a file holding the job's script, created mode 0600 for this job only (name
                   ``hero-job-<random>.<script type>``) and removed when the job ends. With it the
                   script is *not* written on stdin; without it, it is (as for the built-ins).
``{job_id}``, ``{caller_id}``, ``{context_id}``  the job's ids (also in the script's env).
``{script_type}``  the job's script type.

Example::

    [commands]
    v = ["v", "run", "{script_file}"]
    osis = ["osis-run", "--stdin"]       # script on stdin
    [runners]
    v = 2
    osis = 1
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from bus.core.models import RunnerJob
from node.errors import ConfigError

SCRIPT_FILE = "{script_file}"
PLACEHOLDERS = frozenset({"script_file", "job_id", "caller_id", "context_id", "script_type"})
_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
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
        for match in _FIELD.finditer(arg):
            name = match.group(1)
            if name is not None and name not in PLACEHOLDERS:
                raise ConfigError(
                    f"[commands] {script_type}: unknown placeholder {{{name}}} in {arg!r} "
                    f"(known: {', '.join('{' + p + '}' for p in sorted(PLACEHOLDERS))})"
                )
    return list(template)


def script_commands(
    runners: Mapping[str, int], commands: Mapping[str, list[str]]
) -> dict[str, list[str]]:
    """The command of every script type this node runs (a ``[runners]`` entry): configured
    commands first (they may replace a built-in), then the built-ins."""
    table = {**BUILTIN_COMMANDS, **commands}
    return {t: list(table[t]) for t, n in runners.items() if n > 0 and t in table}


def expand(template: list[str], job: RunnerJob, script_file: str = "") -> list[str]:
    """The argv of ``template`` for ``job`` (see the module docstring for the placeholders)."""
    values = {
        "script_file": script_file,
        "job_id": str(job.id),
        "caller_id": str(job.caller_id),
        "context_id": str(job.context_id),
        "script_type": job.script_type,
    }

    def sub(match: re.Match[str]) -> str:
        text = match.group(0)
        if text in ("{{", "}}"):
            return text[0]
        return values.get(match.group(1), text)

    return [_FIELD.sub(sub, arg) for arg in template]


def uses_script_file(template: list[str]) -> bool:
    return any(SCRIPT_FILE in arg for arg in template)


@contextlib.contextmanager
def prepared(
    template: list[str], job: RunnerJob, tmp_dir: Path | None = None
) -> Iterator[tuple[list[str], RunnerJob]]:
    """The argv to run and the job to feed it (its script emptied when it goes in a file).

    With ``{script_file}``, the script is written to a new 0600 file in ``tmp_dir`` (a node
    passes its ``run/jobs``, which a restarted node clears) that is removed on exit.
    Raises OSError if the file cannot be written.
    """
    if not uses_script_file(template):
        yield expand(template, job), job
        return
    if tmp_dir is not None:
        tmp_dir.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="hero-job-", suffix=f".{job.script_type}", dir=tmp_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:  # mkstemp: mode 0600
            fh.write(job.script)
        yield expand(template, job, path), replace(job, script="")
    finally:
        Path(path).unlink(missing_ok=True)
