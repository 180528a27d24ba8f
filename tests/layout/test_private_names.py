"""A module's private names are its own (issue 44, "a wing worth living in"): no module of the
product imports a name that begins with ``_`` from another of its modules, nor reaches one
through a module it imported. What two modules share is a public name of one of them; a
private one used elsewhere is a coupling no reader of its module expects (the batch runner
took ``_Current``, ``_emptied`` and ``_open_logs`` from the job module, and a runner process
the store's ``_dlq_entry``). Each check is shown able to fail."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.layout.test_rooms import ROOT, plant

PRODUCT = ("bus", "node", "crypto", "bench", "deploy", "examples")
# the public API of a named tuple, spelled with a leading underscore so that no field clashes
NAMED_TUPLE_API = {"_fields", "_replace", "_asdict", "_make", "_field_defaults"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in NAMED_TUPLE_API


def borrowed(root: Path = ROOT) -> list[str]:
    """Every private name of a product module used by another (``file:line what``)."""
    found: list[str] = []
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"))
            modules: set[str] = set()  # the names bound to an imported product module (or name)
            for stmt in ast.walk(tree):
                if isinstance(stmt, ast.Import):
                    for alias in stmt.names:
                        if alias.name.split(".")[0] in PRODUCT:
                            modules.add(alias.asname or alias.name.split(".")[0])
                elif isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                    if stmt.module.split(".")[0] not in PRODUCT:
                        continue
                    for alias in stmt.names:
                        if _private(alias.name):
                            found.append(f"{rel}:{stmt.lineno} {stmt.module}.{alias.name}")
                        else:
                            modules.add(alias.asname or alias.name)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and _private(node.attr)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in modules
                ):
                    found.append(f"{rel}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    assert borrowed() == []


def test_the_check_sees_a_private_name_imported_or_reached(tmp_path: Path) -> None:
    planted = {
        "node/worker/batch.py": (
            "from node.worker.job import JobRun, _Current\n"
            "from node.worker import job\n"
            "import bench.cases as cases\n"
            "import logging\n"
            "def f(run):\n"
            "    job._emptied(run.fds)\n"
            "    cases._runner_spies(1, 'a')\n"
            "    logging._srcfile\n"  # not the product's
            "    run._ended()\n"  # an object's, not a module's: not seen here
            "    return JobRun._fields, JobRun.__name__\n"  # a named tuple's API
        ),
    }
    plant(tmp_path, planted)
    assert borrowed(tmp_path) == [
        "node/worker/batch.py:1 node.worker.job._Current",
        "node/worker/batch.py:6 job._emptied",
        "node/worker/batch.py:7 cases._runner_spies",
    ]
