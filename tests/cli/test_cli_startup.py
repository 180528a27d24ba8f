"""``hero-node --help`` and shell completion (argcomplete runs hero-node on every TAB) only build
the parser: they must not import the node, its store client or trio, which would cost each of
them about a second. Each check runs a fresh interpreter, the only place where ``sys.modules``
says what a start imports; how long a start takes is not asserted here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cli.test_cli import ROOT

# ``bus.store.atomic`` is a package: any of its modules imports it
HEAVY = (
    "coredis",
    "trio",
    "anyio",
    "bus.client.api",
    "bus.store.connection",
    "bus.store.lane",
    "bus.store.records",
    "bus.store.atomic",
    "node.daemon",
)

# argv: the module names to look for; prints those the interpreter has imported
PARSER_ONLY = """
import sys

from node.cli.main import build_parser
from node.cli.parsing import walk

for parser in walk(build_parser()):
    parser.format_help()
print(" ".join(name for name in sys.argv[1:] if name in sys.modules))
"""


def test_building_the_parser_and_its_help_imports_no_client_nor_node():
    done = subprocess.run(
        [sys.executable, "-c", PARSER_ONLY, *HEAVY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def imported(argv: list[str], env: dict[str, str]) -> set[str]:
    """The modules ``python -m node.cli ARGV`` imports (``-X importtime`` names each on stderr,
    also when argcomplete ends the process with os._exit)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "node.cli", *argv],
        cwd=ROOT,
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split("|") for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {row[-1].strip() for row in rows if len(row) == 3}


@pytest.mark.parametrize("argv", [["--help"], ["job", "--help"], ["job", "submit", "--help"]])
def test_help_imports_no_client_nor_node(argv):
    names = imported(argv, {})
    assert "node.cli.main" in names  # the run was measured
    assert sorted(names & set(HEAVY)) == []


def test_completion_imports_no_client_nor_node(tmp_path):
    out = tmp_path / "completions.txt"
    line = "hero-node job submit --ti"
    names = imported(
        [],
        {
            "_ARGCOMPLETE": "1",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
        },
    )
    assert out.read_text().split("\v") == ["--timeout "]
    assert sorted(names & set(HEAVY)) == []
