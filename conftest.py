"""Shared fixtures: real Valkey servers on free ports and real nodes (no mocks, no port 6379).

Every server a test starts is stopped by its PID when the test ends.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import settings

from bus.client.api import Client
from bus.core.ids import set_clock
from bus.store.atomic.runs_sync import SyncRuns, connect
from bus.store.connection import Store, open_store
from node.config import NodeConfig
from node.daemon import NodeInfo, run_node
from node.host.acl import ensure_secrets, role_url
from node.host.home import init_home
from node.host.replicated import SET_ROLES, ReplicatedSet
from node.host.valkey import ValkeyProcess, valkey_server

logging.getLogger("trio-websocket").setLevel(logging.WARNING)

# No test asserts on timing (issue 44), and Hypothesis's per-example deadline is such an
# assertion: an example that a loaded machine slows past 200 ms fails as "flaky". Every
# property test runs without one (tests/layout/test_no_timing.py checks it).
settings.register_profile("hero", deadline=None)
settings.load_profile("hero")


def pytest_configure(config: pytest.Config) -> None:
    """pytest 9.2 ids tests in a way pytest-xdist 3.8's ``--dist loadgroup`` cannot extend:
    its groups would be spread over the workers. Said at once, before any test runs."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return
    from importlib.metadata import version

    pytest_v = tuple(int(x) for x in version("pytest").split(".")[:2])
    xdist_v = tuple(int(x) for x in version("pytest-xdist").split(".")[:2])
    if pytest_v >= (9, 2) and xdist_v <= (3, 8):
        raise pytest.UsageError(
            f"--dist loadgroup does not group tests with pytest {version('pytest')} and "
            f"pytest-xdist {version('pytest-xdist')}: install the versions pyproject.toml allows"
        )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (README's test command), every test marked ``xdist_group``
    must carry its group in its id by now, as pytest-xdist's worker gives it: otherwise the
    fault suites would run beside each other, stretching the timings they inject, and the run
    would flake instead of saying why."""
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(lost)} test(s) (e.g. {lost[0]}): this pytest "
            "and pytest-xdist do not work together; install the versions pyproject.toml allows"
        )


# Real Valkey I/O is not a trio sleep: jumping the clock whenever every task waits would let
# trio time run ahead while a reply is on its way. Jumping only after this much real idle time
# keeps the jumps to the moments the node really waits for a timer.
IDLE_BEFORE_JUMP_S = 0.1


@pytest.fixture
def wall_clock_on_trio(mock_clock: trio.testing.MockClock) -> Iterator[None]:
    """Trio's clock autojumps over idle waits, and the node's wall clock (bus.core.ids) follows it:
    a test that also takes ``mock_clock`` sees deadlines that live in timestamps (message
    ages, retry due times, flow deadlines) pass as fast as the trio timers that wait for them."""
    mock_clock.autojump_threshold = IDLE_BEFORE_JUMP_S
    previous = set_clock(lambda: 0.0)
    base = previous() - mock_clock.current_time()
    set_clock(lambda: base + mock_clock.current_time())
    yield
    set_clock(previous)


@pytest.fixture
def valkey_factory(tmp_path: Path) -> Iterator[Callable[[], ValkeyProcess]]:
    """Start as many throwaway Valkey servers as a test needs."""
    stack: list[tuple[ValkeyProcess, object]] = []

    def start() -> ValkeyProcess:
        cm = valkey_server(tmp_path / f"valkey{len(stack)}")
        server = cm.__enter__()
        stack.append((server, cm))
        return server

    yield start
    for _server, cm in reversed(stack):
        cm.__exit__(None, None, None)  # type: ignore[attr-defined]


@pytest.fixture
def redis_url(valkey_factory: Callable[[], ValkeyProcess]) -> str:
    return valkey_factory().url


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[ReplicatedSet]:
    """A replicated store (primary, replicas, Sentinels; node/host/replicated.py) started for
    the test and stopped by its processes' PIDs, with the ACL users' passwords of a home."""
    (tmp_path / "home").mkdir()
    servers = ReplicatedSet(tmp_path / "store", ensure_secrets(tmp_path / "home", SET_ROLES))
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[Store]:
    async with open_store(redis_url) as s:
        yield s


@pytest.fixture
def sync_runs(redis_url: str) -> Iterator[SyncRuns]:
    """The runner processes' blocking transitions (bus/store/atomic/runs_sync.py) on DB 1 of
    the Valkey ``store`` reaches: tests of a job's start, requeue, pop and malformed end run
    the code the runner processes run. Its calls are short scripts, called in trio tests as
    they are (no blocking pop)."""
    client = connect(redis_url, 1)
    yield SyncRuns(client)
    client.close()


class RunningNode:
    """A node running in the test's nursery, with a client on its Redis."""

    def __init__(
        self, config: NodeConfig, info: NodeInfo, client: Client, cancel: trio.CancelScope
    ) -> None:
        self.config = config
        self.info = info
        self.client = client
        self._cancel = cancel
        self.ended = trio.Event()  # set once the node's services have all stopped

    @property
    def node_id(self) -> str:
        return self.info.node_id

    @property
    def store(self) -> Store:
        return self.client.store

    def stop(self) -> None:
        self._cancel.cancel()

    async def stopped(self) -> None:
        """Stop the node and return once it has (its home free for a new boot)."""
        self.stop()
        await self.ended.wait()


@pytest.fixture
def node_factory(tmp_path: Path, nursery: trio.Nursery, valkey_factory):
    """``await start(name)`` -> a RunningNode on its own Valkey, with its default actor/context;
    ``embedded=True``: on the node's embedded Valkey (unix socket, ACL users), its client
    authenticated as the node; ``again=node``: ``node`` (stopped) started anew, a new boot on
    the same home and Valkey."""

    async def start(
        name: str, *, embedded: bool = False, again: RunningNode | None = None, **overrides: object
    ) -> RunningNode:
        if again is not None:  # the same node started anew (stopped first: again.stop())
            config = again.config
        else:
            config = init_home(
                tmp_path / name,
                name=name,
                listen_port=0,
                redis_url="" if embedded else valkey_factory().url,
                runners={"python": 2, "sh": 1},
                console_listen="",  # no web console unless a test passes console=...
            )
            # the tests' jobs announce themselves on the test's Valkey, over TCP: context 1
            # may use the network (docs/security/sandbox.md;
            # tests/sandbox/test_sandbox.py checks the default, no network)
            overrides.setdefault("sandbox", {"1": {"network": True}})
        config = replace(config, **overrides)  # type: ignore[arg-type]

        async def run(*, task_status: trio.TaskStatus[RunningNode]) -> None:
            running: RunningNode | None = None
            try:
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as inner:
                        info = await inner.start(run_node, config)
                        async with open_store(role_url(config, info.redis_url)) as store:
                            running = RunningNode(config, info, Client(store), scope)
                            task_status.started(running)
                            await trio.sleep_forever()
            finally:
                if running is not None:
                    running.ended.set()

        return await nursery.start(run)

    return start
