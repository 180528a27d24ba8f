"""The CLI's parser as a user meets it: --home anywhere, --version, a group's help, and help
text (with defaults) for every option."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from node.cli.main import build_parser
from node.cli.parsing import walk
from tests.test_cli import ROOT

GROUPS = ["job", "flow", "peer", "actor", "context", "dlq", "msg"]


def bare(*args: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """``hero-node ARGS`` with nothing added (no leading --home)."""
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


def test_home_is_accepted_after_the_command(tmp_path):
    home = tmp_path / "h"
    init = bare("init", "--home", str(home))
    assert init.returncode == 0, init.stderr
    assert f"hero-node run --home {home}" in init.stdout
    status = bare("status", "--home", str(home))
    assert status.returncode == 1
    assert f"{home}: the node is not running" in status.stderr
    (home / "node.key").chmod(0o644)  # run then stops at once, having read this home
    run = bare("run", "--home", str(home))
    assert run.returncode == 1
    assert "chmod 600" in run.stderr


def test_version_is_the_package_version():
    from importlib.metadata import version

    result = bare("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"hero-node {version('hero-node')}"


@pytest.mark.parametrize("group", GROUPS)
def test_a_group_alone_shows_its_help(group):
    result = bare(group)
    assert result.returncode == 2
    assert f"usage: hero-node {group} " in result.stderr
    assert "Traceback" not in result.stderr
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name in actions[0].choices[group]._subparsers._group_actions[0].choices:  # type: ignore[union-attr]
        assert name in result.stderr


def test_every_option_has_help():
    missing = [
        f"{parser.prog}: {action.dest}"
        for parser in walk(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert missing == []


def test_help_shows_defaults():
    result = bare("job", "submit", "--help")
    assert result.returncode == 0
    assert "(default: 60)" in result.stdout  # --timeout
    assert "(default: python)" in result.stdout  # --type
    assert "(default: False)" not in result.stdout  # a flag's default says nothing
