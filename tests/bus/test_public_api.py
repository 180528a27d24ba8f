"""The public surface of ``bus``: its names, and the usage example of its docstring, run."""

import re

import trio

import bus
from bus import BusError, Client, ClientError, JobResult, StoreError, new_job, open_client
from bus.client.api import Client as ClientImpl


def test_bus_exports_the_client_api_and_its_errors() -> None:
    assert sorted(bus.__all__) == sorted(set(bus.__all__))
    for name in bus.__all__:
        assert getattr(bus, name).__doc__, name
    assert Client is ClientImpl
    assert callable(new_job)
    assert callable(open_client)
    assert JobResult.__dataclass_fields__.keys() >= {"job_key", "status", "result", "reason"}
    errors = [getattr(bus, n) for n in bus.__all__ if n.endswith("Error")]
    assert {BusError, ClientError, StoreError} <= set(errors)
    assert all(issubclass(e, BusError) for e in errors)


def _example() -> str:
    """The docstring's example, indented block after ``::``, without its ``trio.run`` line."""
    block = (bus.__doc__ or "").split("::\n", 1)[1]
    lines = [line[4:] for line in block.splitlines() if line.startswith("    ") or not line]
    code = "\n".join(lines).split("\n\nEvery error", 1)[0]
    assert "trio.run(main" in code
    return re.sub(r"^trio\.run\(.*$", "", code, flags=re.MULTILINE)


async def test_the_docstring_example_runs_a_job(node_factory, capsys) -> None:
    alice = await node_factory("alice")
    namespace: dict[str, object] = {}
    exec(compile(_example(), "bus.__doc__", "exec"), namespace)
    main = namespace["main"]
    with trio.fail_after(40):
        await main(alice.config.redis_url, str(alice.config.actor_key_path))  # type: ignore[operator]
    assert capsys.readouterr().out == "finished 42\n"


def test_node_exports_resolve_to_their_modules() -> None:
    import node
    from node.daemon import run_node

    assert node.run_node is run_node
    for name in node.__all__:
        assert getattr(node, name).__module__ == node._HOMES[name], name
