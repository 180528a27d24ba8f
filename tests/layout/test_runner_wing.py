"""The runner wing's shape, checked on the source (issue 44 "Checked by tests, not prose"):
the slot's two sides meet only in their shared room, node/slot/; the runner process's own
modules import each other in one direction; each check is shown able to fail."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.layout.test_rooms import ROOT, plant, room_cycles

PROCESS_SIDE, NODE_SIDE = "node.worker", "node.runners"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, at any depth (a function-level or
    TYPE_CHECKING import ties modules as much as a top-level one)."""
    found: list[tuple[int, str]] = []
    for stmt in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(stmt, ast.Import):
            found += [(stmt.lineno, a.name) for a in stmt.names]
        elif isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
            found += [(stmt.lineno, f"{stmt.module}.{a.name}") for a in stmt.names]
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def crossings(root: Path = ROOT) -> list[str]:
    """Every import from one side of the slot into the other (``file:line module``)."""
    found = []
    for side, other in ((PROCESS_SIDE, NODE_SIDE), (NODE_SIDE, PROCESS_SIDE)):
        for path in sorted((root / side.replace(".", "/")).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            found += [f"{rel}:{n} {m}" for n, m in _imports(path) if _within(m, other)]
    return found


def module_cycles(root: Path = ROOT, package: str = PROCESS_SIDE) -> list[list[str]]:
    """The groups of ``package``'s modules that import each other round a loop."""
    folder = root / package.replace(".", "/")
    names = {f"{package}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
    edges: dict[str, dict[str, list[str]]] = {}
    for name in sorted(names):
        for line, target in _imports(folder / f"{name.rsplit('.', 1)[1]}.py"):
            hit = next((m for m in names if _within(target, m) and m != name), None)
            if hit is not None:
                edges.setdefault(name, {}).setdefault(hit, []).append(f"{name}:{line}")
    return room_cycles(edges)


def test_neither_side_of_the_slot_imports_the_other() -> None:
    assert crossings() == []


def test_the_runner_process_imports_in_one_direction() -> None:
    assert module_cycles() == []


def test_the_crossing_check_sees_an_import_either_way(tmp_path: Path) -> None:
    planted = {
        "node/worker/a.py": "def f():\n    from node.runners.processes import x\n",
        "node/runners/b.py": "import node.worker.loop\n",
        "node/runners/c.py": "from node.slot.spec import RunnerSpec\n",  # the shared room
    }
    plant(tmp_path, planted)
    assert crossings(tmp_path) == [
        "node/worker/a.py:2 node.runners.processes.x",
        "node/runners/b.py:1 node.worker.loop",
    ]


def test_the_cycle_check_sees_the_circle_issue_44_found(tmp_path: Path) -> None:
    """Planted: the entry that imported the loop, which imported the job, which imported the
    entry (``pyjobs -> loop -> job -> pyjobs``)."""
    planted = {
        "pyjobs.py": "def main():\n    from node.worker.loop import main\n",
        "loop.py": "from node.worker.job import JobRun\n",
        "job.py": "from node.worker.pyjobs import become_subreaper\n",
        "log.py": "import logging\n",
    }
    (tmp_path / "node" / "worker").mkdir(parents=True)
    for name, text in planted.items():
        (tmp_path / "node" / "worker" / name).write_text(text, encoding="utf-8")
    worker = "node.worker."
    assert module_cycles(tmp_path) == [[worker + "job", worker + "loop", worker + "pyjobs"]]


# -- a result message is built in one place ------------------------------------------------------

PRODUCT = ("bus", "node", "crypto", "bench", "deploy", "examples")


def result_builders(root: Path = ROOT) -> list[str]:
    """Every call that makes a result message (``message_type=MessageType.RESULT``) outside
    the tests (which forge results on purpose): ``file:line``."""
    found = []
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*.py")):
            for call in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(call, ast.Call):
                    continue
                for kw in call.keywords:
                    value = kw.value
                    if (
                        kw.arg == "message_type"
                        and isinstance(value, ast.Attribute)
                        and value.attr == "RESULT"
                    ):
                        found.append(f"{path.relative_to(root).as_posix()}:{call.lineno}")
    return found


def test_a_result_message_is_built_in_one_place() -> None:
    [where] = result_builders()
    assert where.startswith("bus/core/envelope.py:")


def test_the_builder_check_sees_a_second_builder(tmp_path: Path) -> None:
    (tmp_path / "node" / "worker").mkdir(parents=True)
    (tmp_path / "node" / "worker" / "loop.py").write_text(
        "def answer(r):\n    return Message(id=1, message_type=MessageType.RESULT)\n"
        "def other(m):\n    return replace(m, message_type=MessageType.JOB)\n",
        encoding="utf-8",
    )
    assert result_builders(tmp_path) == ["node/worker/loop.py:2"]


# -- a retry is a field, not a string ------------------------------------------------------------

# the text a retry must not be written as, joined here so that this file is no hit itself
RETRY_TEXT = " ".join(("retrying", "after"))
SKIPPED = {".venv", ".git", "node_modules", "build", "dist"}


def retry_texts(root: Path = ROOT) -> list[str]:
    """Every Python file that still writes or parses the retry as text."""
    found = []
    paths = [p for p in root.glob("*.py")]
    for top in sorted(root.iterdir()):
        if top.is_dir() and top.name not in SKIPPED and not top.name.startswith("."):
            paths += top.rglob("*.py")
    for path in sorted(paths):
        rel = path.relative_to(root)
        if SKIPPED & set(rel.parts):
            continue
        if RETRY_TEXT in path.read_text(encoding="utf-8", errors="replace"):
            found.append(rel.as_posix())
    return found


def test_no_python_file_writes_the_retry_as_text() -> None:
    assert retry_texts() == []


def test_the_retry_text_check_sees_a_writer(tmp_path: Path) -> None:
    (tmp_path / "node" / "runners").mkdir(parents=True)
    (tmp_path / "node" / "runners" / "x.py").write_text(
        f'reason = f"{RETRY_TEXT}: {{cause}}"\n', encoding="utf-8"
    )
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "y.py").write_text(f"# {RETRY_TEXT}\n", encoding="utf-8")
    assert retry_texts(tmp_path) == ["node/runners/x.py"]


# -- no redis-py class outside bus/store -------------------------------------------------------


def _module_names(root: Path, tops: tuple[str, ...]) -> list[str]:
    names = []
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join(parts)
            # a __main__ runs its program when imported
            if not name.startswith("bus.store") and parts[-1] != "__main__":
                names.append(name)
    return names


def client_classes(modules: list[str]) -> list[str]:
    """Every name a module holds (imported, aliased or re-exported) that is a class of a
    Redis client library: ``module.name -> library.Class``. Seen at run time, so an alias
    (``StoreFailed = redis.RedisError``) is found where an import check sees none."""
    found = []
    for name in modules:
        module = importlib.import_module(name)
        for attr, value in sorted(vars(module).items()):
            if not isinstance(value, type):
                continue
            home = value.__module__.split(".")[0]
            if home in ("redis", "coredis"):
                found.append(f"{name}.{attr} -> {value.__module__}.{value.__qualname__}")
    return found


def test_no_redis_client_class_is_named_outside_the_store() -> None:
    assert client_classes(_module_names(ROOT, ("bus", "node", "crypto"))) == []


def test_the_class_check_sees_an_alias(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "planted_alias.py").write_text(
        "import redis\nStoreFailed = redis.RedisError\nfrom bus.errors import StoreError\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert client_classes(["planted_alias"]) == [
        "planted_alias.StoreFailed -> redis.exceptions.RedisError"
    ]


def test_one_class_is_named_runner() -> None:
    """The spec's Runner object (bus/core/models.py); the runner process's loop is SlotLoop."""
    from tests.layout.test_rooms import definitions

    assert sorted(d for d in definitions() if d.endswith(":Runner")) == [
        "bus/core/models.py:Runner"
    ]
