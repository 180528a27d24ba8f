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
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from bus.core.models import RunnerJob
from node.config.commands import BUILTIN_COMMANDS, FIELD_PATTERN, SCRIPT_FILE


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

    return [FIELD_PATTERN.sub(sub, arg) for arg in template]


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
