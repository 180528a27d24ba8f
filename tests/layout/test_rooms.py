"""The layout's rules, checked on the source: node/ reaches storage through one door (named
operations of bus/store, never a generic Redis verb or the raw client); no import cycle between
rooms; daemon.py's nursery picture names the services it starts."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def plant(root: Path, files: dict[str, str]) -> None:
    """Write ``files`` (path under ``root``: text) for a check to be shown able to fail."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


# Redis commands (and the Store's generic wrappers of them) that no module outside bus/store may
# call itself: what it does with storage has a name in bus/store (records, lists, atomic/,
# serve).
REDIS_VERBS = frozenset(
    """
    get set set_new getdel getset setex mget mset incr incrby decr del delete unlink exists
    expire pexpire ttl pttl persist type rename keys scan scan_keys scan_page hget hgetall hset
    hsetnx hmget hmset hmget_many hgetall_many hdel hincrby hexists hlen hkeys hvals lpush rpush
    lpop rpop blpop brpop lmove blmove rpoplpush brpoplpush llen llen_many lrange lrange_head
    lrem lindex lpos lset ltrim sadd srem smembers sismember scard zadd zrem zrange
    zrangebyscore zscore zcard xadd xadd_capped xrange xlen publish subscribe eval evalsha
    script scripts call read transact transaction pipeline db count_existing exists_many
    list_length list_all list_head hash_fields hash_all command
    """.split()
)
# The store itself, where the verbs belong.
STORE = ("bus/store/",)
# Calls that hand a raw client (or a transaction) to a function of the caller's.
_HANDS_OUT_CLIENT = {"call", "read", "transact"}
_OPENS_CLIENT = {"transaction", "pipeline"}


# The names a store is held under: the node's Store (``store``), a runner process's SyncRuns
# (``runs``, ``sync_runs``; bus/store/atomic/runs_sync.py), whose generic verbs are gone too.
STORE_RECEIVERS = frozenset({"store", "runs", "sync_runs"})


def _receiver_is_store(node: ast.expr) -> bool:
    """``store.x(...)``, ``node.store.x(...)``, ``self.runs.x(...)``: a Store or a SyncRuns."""
    if isinstance(node, ast.Name):
        return node.id in STORE_RECEIVERS
    return isinstance(node, ast.Attribute) and node.attr in STORE_RECEIVERS


def _opened_by(node: ast.expr, verbs: set[str]) -> bool:
    """``x.transaction(...)``, ``x.pipeline(...)`` and the like (``verbs``)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in verbs
    )


def _raw_clients(tree: ast.AST) -> set[str]:
    """Names that hold a raw client or a transaction in this module: ``as tx`` of a
    ``with x.transaction()``/``pipeline()``, and the parameters of a lambda or a function
    handed to ``store.call``/``read``/``transact``."""
    names: set[str] = set()
    handed: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                opened = _opened_by(item.context_expr, _OPENS_CLIENT)
                if opened and isinstance(item.optional_vars, ast.Name):
                    names.add(item.optional_vars.id)
        if _opened_by(node, _HANDS_OUT_CLIENT):
            assert isinstance(node, ast.Call)
            for arg in node.args:
                if isinstance(arg, ast.Lambda):
                    names |= {a.arg for a in arg.args.args}
                elif isinstance(arg, ast.Name):
                    handed.add(arg.id)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in handed:
            names |= {a.arg for a in node.args.args if a.arg != "self"}
    return names


def _speaks_redis(call: ast.Call, clients: set[str]) -> str | None:
    """The verb ``call`` sends to Redis itself, if it does."""
    if not isinstance(call.func, ast.Attribute):
        return None
    verb, receiver = call.func.attr, call.func.value
    if isinstance(receiver, ast.Name) and receiver.id in clients:
        return verb  # anything said to a raw client or a transaction is a verb
    if _opened_by(receiver, {"db", "_db"}):
        return verb  # a raw client fetched by DB number
    held = isinstance(receiver, ast.Attribute) and receiver.attr == "client"
    if verb in REDIS_VERBS and (held or _receiver_is_store(receiver)):
        return verb  # a Store's generic wrapper, or a raw client another object holds
    return None


def _modules(root: Path, tops: tuple[str, ...]) -> Iterator[tuple[str, ast.AST]]:
    """(path, tree) of every checked module below ``tops``, the store aside."""
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if not rel.startswith(STORE):
                yield rel, ast.parse(path.read_text(encoding="utf-8"))


def raw_verb_calls(
    root: Path = ROOT, tops: tuple[str, ...] = ("bus", "node", "crypto")
) -> list[str]:
    """Every Redis verb sent outside bus/store (``file:line verb``): on a Store, on a raw
    client it hands out, or on a transaction or pipeline."""
    found = []
    for rel, tree in _modules(root, tops):
        clients = _raw_clients(tree)
        for call in ast.walk(tree):
            verb = _speaks_redis(call, clients) if isinstance(call, ast.Call) else None
            if verb is not None:
                found.append(f"{rel}:{call.lineno} {verb}")
    return sorted(found, key=lambda s: (s.split(":")[0], int(s.split(":")[1].split()[0])))


def raw_store_calls(root: Path = ROOT) -> list[str]:
    """Every Redis verb sent from node/ (``file:line verb``)."""
    return raw_verb_calls(root, ("node",))


def redis_imports(root: Path = ROOT, tops: tuple[str, ...] = ("node",)) -> list[str]:
    """Every import of a Redis client library below ``tops``, the store aside."""
    found = []
    for rel, tree in _modules(root, tops):
        for stmt in ast.walk(tree):
            names: list[str] = []
            if isinstance(stmt, ast.Import):
                names = [a.name for a in stmt.names]
            elif isinstance(stmt, ast.ImportFrom) and stmt.module:
                names = [stmt.module]
            found += [
                f"{rel}:{stmt.lineno} {n}" for n in names if n.split(".")[0] in {"redis", "coredis"}
            ]
    return found


def test_node_calls_no_redis_verb_on_a_store() -> None:
    assert raw_store_calls() == []


def test_node_imports_no_redis_client() -> None:
    assert redis_imports() == []


def test_no_module_outside_the_store_speaks_redis() -> None:
    """Issue 22: every door to Redis is a named operation of bus/store; the blocking client's
    too (bus/store/blocking.py)."""
    assert raw_verb_calls() == []


def test_no_module_outside_the_store_imports_a_redis_client() -> None:
    assert redis_imports(ROOT, ("bus", "node", "crypto")) == []


def test_the_check_sees_a_raw_call(tmp_path: Path) -> None:
    """The walk is not blind: a raw verb and a raw client, planted in a copy, are found."""
    room = tmp_path / "node" / "intake"
    room.mkdir(parents=True)
    (room / "bad.py").write_text(
        "import coredis\n\nasync def f(node):\n"
        "    await node.store.hgetall(1, 'k')\n"
        "    await node.store.call(1, lambda r: r.llen('q'))\n",
        encoding="utf-8",
    )
    assert raw_store_calls(tmp_path) == [
        "node/intake/bad.py:4 hgetall",
        "node/intake/bad.py:5 call",
        "node/intake/bad.py:5 llen",
    ]
    assert redis_imports(tmp_path) == ["node/intake/bad.py:1 coredis"]


def test_the_check_sees_every_door_outside_the_store(tmp_path: Path) -> None:
    """A transaction's verbs, a raw client handed to a function or fetched by DB number, in
    bus/ outside the store, are found; the store's own verbs and lookalikes are not."""
    planted = {
        "bus/client/bad.py": (
            "async def f(self, path, d):\n"
            "    async with self.store.transaction(0) as tx:\n"
            "        tx.hset('k', {})\n"
            "    async def read(r):\n"
            "        return await r.hget('k', 'f')\n"
            "    await self.store.call(0, read)\n"
            "    self._db(0).blpop(['q'], timeout=1)\n"
            "    self.runs.client.llen('q')\n"
            "    self.runs.hash_all('job:1:1')\n"
            "    runs.list_length('q')\n"
            "    return path.exists() or d.get('x') or self.store.pop_batch(0, 'a', 'b', 1)\n"
        ),
        "bus/store/fine.py": "async def f(store):\n    await store.hgetall(0, 'k')\n",
    }
    plant(tmp_path, planted)
    assert raw_verb_calls(tmp_path) == [
        "bus/client/bad.py:2 transaction",
        "bus/client/bad.py:3 hset",
        "bus/client/bad.py:5 hget",
        "bus/client/bad.py:6 call",
        "bus/client/bad.py:7 blpop",
        "bus/client/bad.py:8 llen",
        "bus/client/bad.py:9 hash_all",
        "bus/client/bad.py:10 list_length",
    ]


def wall_clock_reads(root: Path = ROOT) -> list[str]:
    """Every ``time.time()`` in bus/ and node/: they read wall-clock time through the one
    injectable clock of bus/core/ids.py, so that tests can drive it."""
    found = []
    for top in ("bus", "node"):
        for path in sorted((root / top).rglob("*.py")):
            for call in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                func = call.func if isinstance(call, ast.Call) else None
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr == "time"
                    and isinstance(func.value, ast.Name)
                    and func.value.id == "time"
                ):
                    found.append(f"{path.relative_to(root).as_posix()}:{call.lineno}")
    return found


def test_no_wall_clock_read_but_the_clock(tmp_path: Path) -> None:
    assert wall_clock_reads() == []
    (tmp_path / "node" / "cli").mkdir(parents=True)
    (tmp_path / "node" / "cli" / "x.py").write_text("import time\nt = time.time()\n")
    assert wall_clock_reads(tmp_path) == ["node/cli/x.py:2"]


def test_node_keeps_at_most_eight_flat_modules() -> None:
    """What is not the daemon's own belongs in a room (issue 22)."""
    flat = sorted(p.name for p in (ROOT / "node").glob("*.py"))
    assert len(flat) <= 8, flat


# -- no import cycle between rooms ------------------------------------------------------------

# A room is a package of bus/ or node/ (bus.core, node.intake, ...) or a flat module beside them
# (bus.errors, node.state, node.config); crypto is one room. Imports at any depth count (a
# function-level or TYPE_CHECKING import ties the rooms as much as a top-level one).


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str, root: Path = ROOT) -> str | None:
    """The room ``module`` (or a name inside it) belongs to; None outside bus, node, crypto."""
    parts = module.split(".")
    if parts[0] == "crypto":
        return "crypto"
    if parts[0] not in ("bus", "node"):
        return None
    if len(parts) == 1:
        return parts[0]
    second = root / parts[0] / parts[1]
    if second.is_dir() or second.with_suffix(".py").is_file():
        return ".".join(parts[:2])
    return parts[0]  # a name the package's __init__ defines


def room_imports(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """importer room -> imported room -> the imports (``module:line target``) that tie them."""
    edges: dict[str, dict[str, list[str]]] = {}
    for top in ("bus", "node", "crypto"):
        for path in sorted((root / top).rglob("*.py")):
            module = _module_name(path, root)
            source = room_of(module, root)
            if source is None:
                continue
            for stmt in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                targets: list[str] = []
                if isinstance(stmt, ast.Import):
                    targets = [a.name for a in stmt.names]
                elif isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                    targets = [f"{stmt.module}.{a.name}" for a in stmt.names]
                for target in targets:
                    room = room_of(target, root)
                    if room is not None and room != source:
                        where = f"{module}:{stmt.lineno} {target}"
                        edges.setdefault(source, {}).setdefault(room, []).append(where)
    return edges


def room_cycles(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The groups of rooms that import each other, directly or round a loop (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(room: str) -> None:
        index[room] = low[room] = len(index)
        stack.append(room)
        for other in edges.get(room, {}):
            if other not in index:
                visit(other)
                low[room] = min(low[room], low[other])
            elif other in stack:
                low[room] = min(low[room], index[other])
        if low[room] == index[room]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == room:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for room in sorted(edges):
        if room not in index:
            visit(room)
    return found


def _explain(edges: dict[str, dict[str, list[str]]], group: list[str]) -> str:
    ties = [
        f"  {a} -> {b}: {edges[a][b][:3]}" for a in group for b in group if b in edges.get(a, {})
    ]
    return "\n".join([" <-> ".join(group), *ties])


def test_no_import_cycle_between_rooms() -> None:
    edges = room_imports()
    cycles = room_cycles(edges)
    assert not cycles, "\n".join(_explain(edges, group) for group in cycles)


def test_the_bus_imports_no_node_and_crypto_no_bus() -> None:
    edges = room_imports()
    wrong = [
        f"{a} -> {b}: {ties[:3]}"
        for a, to in edges.items()
        for b, ties in to.items()
        if (a.startswith("bus") and b.startswith("node")) or (a == "crypto" and b.startswith("bus"))
    ]
    assert wrong == []


def test_the_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    """Planted: a function-level import from one room back into another that imports it."""
    for room, text in {
        "node/intake/a.py": "from node.runners.b import f\n",
        "node/runners/b.py": "def f():\n    from node.intake import a\n",
        "node/state.py": "import node.intake.a\n",
    }.items():
        (tmp_path / room).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / room).write_text(text, encoding="utf-8")
    edges = room_imports(tmp_path)
    assert room_cycles(edges) == [["node.intake", "node.runners"]]
    assert edges["node.state"] == {"node.intake": ["node.state:1 node.intake.a"]}


# -- daemon.py's nursery picture is the nursery --------------------------------------------------

DAEMON = ROOT / "node" / "daemon.py"
GROUPS = {"services", "per"}  # lines of the picture that group services, not services


def pictured_services(source: str) -> set[str]:
    """The functions daemon.py's picture (its docstring) names: the first word of each branch."""
    doc = ast.get_docstring(ast.parse(source)) or ""
    names = set()
    for line in doc.splitlines():
        for glyph in ("├── ", "└── "):
            if glyph in line:
                names.add(line.split(glyph, 1)[1].split()[0])
    return names - GROUPS


def _callable_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else ""


def _started(args: list[ast.expr]) -> str:
    """The function a ``start``/``start_soon`` call with ``args`` runs (through ``resilient``)."""
    first = args[0]
    if _callable_name(first) == "resilient":
        return _callable_name(args[2])
    if isinstance(first, ast.Call) and _callable_name(first.func) == "partial":
        inner = first.args
        if _callable_name(inner[0]) in ("start", "start_soon"):
            return _started(inner[1:])
    return _callable_name(first)


def started_services(source: str) -> set[str]:
    """Every function daemon.py starts in a nursery, except its own private grouping helpers
    (``_run_context``: the per-context services, and the like)."""
    names = set()
    for call in ast.walk(ast.parse(source)):
        if isinstance(call, ast.Call) and _callable_name(call.func) in ("start", "start_soon"):
            if call.args:
                names.add(_started(call.args))
        if isinstance(call, ast.Call) and _callable_name(call.func) == "partial":
            if call.args and _callable_name(call.args[0]) in ("start", "start_soon"):
                names.add(_started(call.args[1:]))
    return {n for n in names if n and not n.startswith("_")}


def test_the_nursery_picture_shows_the_services_started() -> None:
    source = DAEMON.read_text(encoding="utf-8")
    started = started_services(source)
    assert {"run_supervisor", "run_runner_process"} <= started  # the walk sees them
    assert pictured_services(source) == started


def test_the_picture_check_sees_a_missing_service() -> None:
    source = DAEMON.read_text(encoding="utf-8").replace(
        'await nursery.start(resilient, f"reaper {ctx}", run_reaper, node, ctx)',
        'await nursery.start(resilient, f"reaper {ctx}", run_reaper, node, ctx)\n'
        '            await nursery.start(resilient, "new", run_something_new, node)',
    )
    assert "run_something_new" in started_services(source)
    assert "run_something_new" not in pictured_services(source)


def test_no_test_module_lies_flat_in_tests() -> None:
    """Tests live by room (tests/<room>/, beside the code's rooms), none flat in tests/."""
    tests = ROOT / "tests"
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    rooms = {p.parent.name for p in tests.glob("*/test_*.py")}
    assert {"bus", "intake", "runners", "layout"} <= rooms
    assert all((tests / room / "__init__.py").is_file() for room in rooms)


def definitions(root: Path = ROOT, tops: tuple[str, ...] = ("bus", "node", "crypto")) -> set[str]:
    """``module:name`` of every class and function defined below ``tops``."""
    found = set()
    for top in tops:
        for path in (root / top).rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    found.add(f"{rel}:{node.name}")
    return found


def test_the_dead_code_issue_22_named_stays_gone() -> None:
    names = {d.split(":")[1] for d in definitions()}
    assert not {"WorkerLost", "may_read"} & names
    assert not any(d.startswith("bus/wire/outbox.py:enqueue") for d in definitions())


# -- names a page says a module defines (tests/layout/test_message_walk.py checks the docs'
# "Follow a message" against a trace of a job; this is how it reads a module's names) ---------


def defined_names(path: Path) -> set[str]:
    """What a module defines at its top level, and its classes' methods, as ``Class.method``
    and as ``method`` (how a walk may name one)."""
    names: set[str] = set()
    for stmt in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        if isinstance(stmt, ast.ClassDef):
            for m in stmt.body:
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef):
                    names |= {m.name, f"{stmt.name}.{m.name}"}
    return names
