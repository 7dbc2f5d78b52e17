"""A TCP proxy on loopback for fault injection between Kafka clients and the broker (stdlib asyncio, run in a
background thread). The broker must advertise the proxy's port, or clients reconnect around it::

    port = free_port()
    with local_broker("apache", advertised_port=port) as broker, KafkaProxy(port, broker.port) as proxy:
        proxy.drop_requests({PRODUCE})   # produce requests vanish: no response, as if the broker were gone
        proxy.drop_responses(PRODUCE, times=1)  # the broker handles the next produce; its answer is lost
        proxy.cut_after_bytes(PRODUCE, 40, times=1)  # the next produce is cut mid-frame: connection reset
        proxy.cut_after_bytes(PRODUCE, 1 << 30, times=1)  # forwarded whole, then reset before the answer
        proxy.cut()                      # every connection reset, new ones refused
        proxy.heal()

Client-to-broker bytes are split into Kafka request frames (4-byte length, then api_key int16, api_version
int16, correlation_id int32), so requests of one kind can be dropped or cut while the rest of the protocol
(fetch, heartbeats, commits) keeps working; broker-to-client bytes are split into response frames (4-byte
length, then correlation_id), so the response to one request can be swallowed after the broker acted on it.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections import Counter
from types import TracebackType

__all__ = ["FETCH", "OFFSET_COMMIT", "PRODUCE", "KafkaProxy"]

PRODUCE = 0
FETCH = 1
OFFSET_COMMIT = 8


class KafkaProxy:
    def __init__(self, listen_port: int, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.host, self.listen_port, self.upstream_port = host, listen_port, upstream_port
        self.requests: Counter[int] = Counter()  # api_key -> requests forwarded
        self.dropped: Counter[int] = Counter()
        self.responses_dropped: Counter[int] = Counter()  # api_key -> responses swallowed
        self.cuts: Counter[int] = Counter()  # api_key -> requests whose connection was reset after n bytes
        self._drop: frozenset[int] = frozenset()
        self._drop_responses: dict[int, int] = {}  # api_key -> how many more responses to swallow
        self._cut_after: dict[int, tuple[int, int]] = {}  # api_key -> (bytes forwarded, how many more cuts)
        self._down = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kafka-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    # -- control (thread-safe) ---------------------------------------------------------------------------------

    def start(self) -> KafkaProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(5)
        return self

    def drop_requests(self, api_keys: set[int]) -> None:
        """Swallow requests with these api keys (the client sees no response)."""
        self._drop = frozenset(api_keys)

    def drop_responses(self, api_key: int, *, times: int) -> None:
        """Forward the next `times` requests with this api key, but swallow the broker's responses: the
        client cannot know whether the request took effect (an ambiguous produce) and retries it."""
        self._drop_responses[api_key] = times

    def cut_after_bytes(self, api_key: int, n: int, *, times: int) -> None:
        """For the next `times` requests with this api key, forward only the first `n` bytes of the frame,
        then reset the connection: the broker sees a truncated request, or (n >= the frame's size) a whole one
        it may act on, while the client only sees the reset."""
        self._cut_after[api_key] = (n, times)

    def cut(self) -> None:
        """Reset every connection and refuse new ones until `heal()`."""
        self._down = True
        asyncio.run_coroutine_threadsafe(self._close_all(), self._loop).result(5)

    def heal(self) -> None:
        self._down = False
        self._drop = frozenset()
        self._drop_responses.clear()
        self._cut_after.clear()

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            await self._close_all()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()

    def __enter__(self) -> KafkaProxy:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- the proxy ---------------------------------------------------------------------------------------------

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.listen_port)

    async def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._down:
            client_w.transport.abort()
            return
        try:
            upstream_r, upstream_w = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            client_w.transport.abort()
            return
        self._writers |= {client_w, upstream_w}
        swallow: dict[int, int] = {}  # correlation id -> api key, of requests whose response is to be lost
        try:
            await asyncio.gather(
                self._requests(client_r, upstream_w, swallow),
                self._responses(upstream_r, client_w, swallow),
                return_exceptions=True,
            )
        except asyncio.CancelledError:
            pass  # the proxy is stopping with this connection open
        finally:
            for writer in (client_w, upstream_w):
                writer.transport.abort()
                self._writers.discard(writer)

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, swallow: dict[int, int]
    ) -> None:
        while not self._down:
            head = await reader.readexactly(4)
            (size,) = struct.unpack(">i", head)
            body = await reader.readexactly(size)
            api_key, _version, correlation_id = struct.unpack(">hhi", body[:8])
            if self._down:
                break
            if api_key in self._drop:
                self.dropped[api_key] += 1
                continue
            cut = self._cut_after.get(api_key)
            if cut is not None and cut[1] > 0:
                self._cut_after[api_key] = (cut[0], cut[1] - 1)
                self.cuts[api_key] += 1
                writer.write((head + body)[: cut[0]])
                await writer.drain()
                break  # both directions are reset by _accept
            left = self._drop_responses.get(api_key, 0)
            if left > 0:
                self._drop_responses[api_key] = left - 1
                swallow[correlation_id] = api_key
            self.requests[api_key] += 1
            writer.write(head + body)
            await writer.drain()
        writer.transport.abort()

    async def _responses(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, swallow: dict[int, int]
    ) -> None:
        while not self._down:
            head = await reader.readexactly(4)
            (size,) = struct.unpack(">i", head)
            body = await reader.readexactly(size)
            (correlation_id,) = struct.unpack(">i", body[:4])
            api_key = swallow.pop(correlation_id, None)
            if api_key is not None:
                self.responses_dropped[api_key] += 1
                continue
            writer.write(head + body)
            await writer.drain()
        writer.transport.abort()
