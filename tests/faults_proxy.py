"""A small TCP proxy for fault injection: it forwards 127.0.0.1:<port> to a target port, and can
cut the link (close every proxied connection and stop listening, so new dials are refused) and
restore it on the same port, or freeze it (forward nothing, close nothing: a silent network)
and thaw it. It can also delay every chunk it forwards by ``delay_s`` (order
kept), and run as its own process (inside a network namespace, under ``ip netns exec``):

    python -m tests.faults_proxy LISTEN_HOST:PORT TARGET_HOST:PORT [DELAY_S]

which prints ``ready`` once listening and serves until it is terminated."""

from __future__ import annotations

import math
import sys
from functools import partial

import trio

from node.host.valkey import free_port


class TcpProxy:
    def __init__(
        self,
        target_port: int,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        target_host: str = "127.0.0.1",
        delay_s: float = 0.0,
        record: bool = False,
    ) -> None:
        self.target_port = target_port
        self.target_host = target_host
        self.host = host
        self.port = port or free_port()
        self.url = f"ws://{host}:{self.port}"
        self.delay_s = delay_s
        # every byte forwarded, each direction apart, when recording (what a path observer sees)
        self.to_target: bytearray | None = bytearray() if record else None
        self.to_client: bytearray | None = bytearray() if record else None
        self.accepted = 0  # connections accepted (metrics for the test's report)
        self.upstream_refused = 0  # accepted, but the target was not listening
        self._scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None
        self._thawed = trio.Event()  # set while data flows
        self._thawed.set()
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

    def freeze(self) -> None:
        """Forward nothing more (what arrives is held), and close nothing."""
        if self._thawed.is_set():
            self._thawed = trio.Event()

    def thaw(self) -> None:
        self._thawed.set()

    async def flowing(self) -> None:
        """Return once data may flow."""
        await self._thawed.wait()

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
                    listeners = await trio.open_tcp_listeners(self.port, host=self.host)
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
            upstream = await trio.open_tcp_stream(self.target_host, self.target_port)
        except OSError:
            self.upstream_refused += 1
            await client.aclose()
            return
        async with client, upstream, trio.open_nursery() as nursery:
            for src, dst, tape in (
                (client, upstream, self.to_target),
                (upstream, client, self.to_client),
            ):
                nursery.start_soon(_pump, src, dst, nursery.cancel_scope, self, tape)


async def _pump(
    src: trio.SocketStream,
    dst: trio.SocketStream,
    both: trio.CancelScope,
    proxy: TcpProxy,
    tape: bytearray | None = None,
) -> None:
    """Copy src to dst (each chunk ``delay_s`` after it arrived, none while frozen) until either
    side closes; then end both directions."""
    delay_s = proxy.delay_s
    try:
        if delay_s <= 0:
            async for chunk in src:
                await proxy.flowing()
                if tape is not None:
                    tape += chunk
                await dst.send_all(chunk)
            return
        # Unbounded: a test's traffic is small, and a bound would add back-pressure to the
        # delay (a slower link, not a longer one).
        send, receive = trio.open_memory_channel[tuple[float, bytes]](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_deliver, receive, dst, proxy)
            async with send:
                async for chunk in src:
                    send.send_nowait((trio.current_time() + delay_s, bytes(chunk)))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        both.cancel()


async def _deliver(
    chunks: trio.MemoryReceiveChannel[tuple[float, bytes]], dst: trio.SocketStream, proxy: TcpProxy
) -> None:
    async for due, chunk in chunks:
        await trio.sleep_until(due)
        await proxy.flowing()
        await dst.send_all(chunk)


async def _main(listen: str, target: str, delay_s: float) -> None:
    host, port = listen.rsplit(":", 1)
    target_host, target_port = target.rsplit(":", 1)
    proxy = TcpProxy(
        int(target_port), int(port), host=host, target_host=target_host, delay_s=delay_s
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        print("ready", flush=True)


if __name__ == "__main__":
    trio.run(_main, sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
