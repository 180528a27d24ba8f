"""A small TCP proxy for fault injection: it forwards 127.0.0.1:<port> to a target port, and can
cut the link (close every proxied connection and stop listening, so new dials are refused) and
restore it on the same port."""

from __future__ import annotations

from functools import partial

import trio

from node.host.valkey import free_port


class TcpProxy:
    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        self.accepted = 0  # connections accepted (metrics for the test's report)
        self.upstream_refused = 0  # accepted, but the target was not listening
        self._scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (reports started once listening)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._serve)
            task_status.started()
            await trio.sleep_forever()

    @property
    def is_up(self) -> bool:
        return self._done is not None and not self._done.is_set()

    async def cut(self) -> None:
        """Close every proxied connection and the listener; returns once the port is closed."""
        assert self._scope is not None
        assert self._done is not None
        self._scope.cancel()
        with trio.fail_after(10):
            await self._done.wait()

    async def restore(self) -> None:
        """Listen again on the same port."""
        assert self._nursery is not None
        assert not self.is_up
        await self._nursery.start(self._serve)

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        done = trio.Event()
        self._done = done
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                async with trio.open_nursery() as handlers:
                    listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
                    await handlers.start(
                        partial(trio.serve_listeners, handler_nursery=handlers),
                        self._handle,
                        listeners,
                    )
                    task_status.started()
        finally:
            done.set()

    async def _handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        except OSError:
            self.upstream_refused += 1
            await client.aclose()
            return
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
            nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)


async def _pump(src: trio.SocketStream, dst: trio.SocketStream, both: trio.CancelScope) -> None:
    """Copy src to dst until either side closes; then end both directions."""
    try:
        async for chunk in src:
            await dst.send_all(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        both.cancel()
