"""A loopback TCP proxy in front of the API server that a test can hold.

A component whose kubeconfig points here reaches the API server only through the
proxy. While it is held, what the component sends waits in the proxy and reaches
the server when it is released; what the server sends still arrives. That is a
component whose requests are slow to land (a congested uplink, client-side rate
limiting, a stalled connection): for the scheduler, a decision taken on what it
saw, written seconds later. TLS passes through untouched (the serving
certificate names 127.0.0.1, whatever the port).
"""

from __future__ import annotations

import asyncio
import contextlib


class HoldableProxy:
    """Forwards 127.0.0.1:<port> to the API server; :meth:`hold` and :meth:`release` the uplink."""

    def __init__(self, name: str, upstream_port: int) -> None:
        self.name = name
        self.upstream_port = upstream_port
        self.port = 0
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.held_bytes = 0  # sent while held (so a test can tell something was held back)

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    @property
    def held(self) -> bool:
        return not self._open.is_set()

    def hold(self) -> None:
        self.held_bytes = 0
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def stop(self) -> None:
        self._open.set()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            except OSError:
                return  # the API server is down (restarting): the client sees a closed connection
            up = asyncio.create_task(self._pump(client_reader, server_writer, gated=True))
            down = asyncio.create_task(self._pump(server_reader, client_writer, gated=False))
            try:
                await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in (up, down):
                    pump.cancel()
                    with contextlib.suppress(asyncio.CancelledError, OSError):
                        await pump
                server_writer.close()
        finally:
            client_writer.close()
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, gated: bool) -> None:
        while chunk := await reader.read(65536):
            if gated and not self._open.is_set():
                self.held_bytes += len(chunk)
                await self._open.wait()
            writer.write(chunk)
            await writer.drain()
