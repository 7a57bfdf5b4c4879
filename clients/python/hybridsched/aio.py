"""asyncio client: one authenticated connection to one worker, many requests in flight.

A reader task matches every answer to its request by ``request_id`` (the several ``allocated``
frames of a GUARANTEED ask included) and queues pushed frames (events, reservation notices)
for :meth:`AsyncClient.next_event` / :meth:`AsyncClient.next_pushed`. Mirrors the Rust
``testbed::client::AppClient``.
"""

import asyncio
import collections
import ssl
import struct

from . import protocol as p
from .errors import (ClientError, ConnectError, ConnectionClosed, ProtocolViolation,
                     RequestTimeout, ServerError)

DEFAULT_TIMEOUT = 30.0
_PUSHED = ("event", "reservation_reprovisioned", "reservation_cancelled")
_LEN = struct.Struct(">I")


async def _read_frame(reader):
    (length,) = _LEN.unpack(await reader.readexactly(4))
    if length > p.MAX_FRAME:
        raise ProtocolViolation(f"the worker announced a {length}-byte frame; the cap is {p.MAX_FRAME}")
    return p.decode_payload(await reader.readexactly(length))


async def _bounded(aw, timeout, what):
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:
        raise RequestTimeout(f"{what}: nothing within {timeout} s") from None


class AsyncClient:
    """Use ``await AsyncClient.connect(...)`` (or ``async with await AsyncClient.connect(...)``).
    Every wait is bounded by ``timeout`` seconds (per call or the connection's default;
    ``None`` waits for ever); a request that times out is forgotten (a late answer is dropped).
    """

    def __init__(self):
        raise TypeError("use `await AsyncClient.connect(endpoint, app_id, app_secret, ...)`")

    @classmethod
    async def connect(cls, endpoint, app_id, app_secret, *, ca_file=None,
                      client_name="hybridsched-py-asyncio", timeout=DEFAULT_TIMEOUT):
        self = object.__new__(cls)
        self.endpoint = endpoint if isinstance(endpoint, p.Endpoint) else p.Endpoint.parse(endpoint)
        hello = p.hello_frame(app_id, app_secret, client_name)
        self.timeout = timeout
        self.app_id = app_id
        self._waiters = {}  # request_id -> asyncio.Queue of frames or exceptions
        self._pushed = asyncio.Queue()
        self._next_id = 1
        self._closed = None
        self.notices = []
        ep = self.endpoint
        try:
            if ep.kind == "unix":
                opening = asyncio.open_unix_connection(ep.address)
            else:
                host, port = ep.host_port()
                ctx = None
                if ep.kind == "tls":
                    if ca_file is None:
                        raise ConnectError(ep.text, "a tls:// endpoint needs the cluster CA "
                                                    "(ca_file=.../ca.pem)")
                    ctx = ssl.create_default_context(cafile=str(ca_file))
                opening = asyncio.open_connection(host, port, ssl=ctx,
                                                  server_hostname=host if ctx else None)
            self._reader, self._writer = await asyncio.wait_for(opening, timeout)
        except ClientError:
            raise
        except asyncio.TimeoutError:
            raise ConnectError(ep.text, f"no connection within {timeout} s") from None
        except (OSError, ssl.SSLError) as e:
            raise ConnectError(ep.text, str(e)) from None
        try:
            self._writer.write(p.encode_frame(hello))
            welcome = await _bounded(_read_frame(self._reader), timeout, f"hello to {ep}")
            if welcome["type"] == "error":
                raise ServerError.from_frame(welcome)
            if welcome["type"] != "welcome":
                raise ProtocolViolation(f"expected welcome, got {welcome['type']!r}")
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            self._writer.close()
            raise ConnectionClosed(ep.text, f"during the hello: {e}") from None
        except BaseException:
            self._writer.close()
            raise
        self.node_id = welcome.get("node_id")
        self.max_frame_bytes = welcome.get("max_frame_bytes", p.MAX_FRAME)
        self._task = asyncio.get_running_loop().create_task(self._read_loop())
        return self

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self):
        if self._closed is None:
            self._closed = "closed by the client"
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except Exception:
            pass
        self._fail_all(ConnectionClosed(self.endpoint.text, self._closed))

    def _fail_all(self, exc):
        for q in self._waiters.values():
            q.put_nowait(exc)
        self._pushed.put_nowait(exc)

    async def _read_loop(self):
        try:
            while True:
                frame = await _read_frame(self._reader)
                if frame["type"] in _PUSHED:
                    self._pushed.put_nowait(frame)
                    continue
                rid = frame.get("request_id")
                if frame["type"] == "error" and rid is None:
                    self._fail_all(ServerError.from_frame(frame))
                    continue
                q = self._waiters.get(rid)
                if q is not None:
                    q.put_nowait(frame)
        except asyncio.CancelledError:
            raise
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self._closed = self._closed or "the worker closed the connection"
        except ProtocolViolation as e:
            self._closed = str(e)
        self._fail_all(ConnectionClosed(self.endpoint.text, self._closed))

    def _timeout(self, timeout):
        return self.timeout if timeout is ... else timeout

    async def _submit(self, frame):
        if self._closed is not None:
            raise ConnectionClosed(self.endpoint.text, self._closed)
        rid = self._next_id
        self._next_id += 1
        data = p.encode_frame(dict(frame, request_id=rid))
        self._waiters[rid] = asyncio.Queue()
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError) as e:
            del self._waiters[rid]
            raise ConnectionClosed(self.endpoint.text, f"write failed: {e}") from None
        return rid

    async def _take(self, rid, timeout):
        item = await _bounded(self._waiters[rid].get(), timeout, f"request {rid} to {self.endpoint}")
        if isinstance(item, BaseException):
            raise item
        if item["type"] == "error":
            raise ServerError.from_frame(item)
        return item

    async def request(self, frame, expect, timeout=...):
        rid = await self._submit(frame)
        try:
            ans = await self._take(rid, self._timeout(timeout))
        finally:
            self._waiters.pop(rid, None)
        if ans["type"] != expect:
            raise ProtocolViolation(f"expected {expect!r}, got {ans['type']!r}")
        return ans

    # -- events ---------------------------------------------------------------------------

    async def next_pushed(self, timeout=...):
        item = await _bounded(self._pushed.get(), self._timeout(timeout),
                              f"waiting for an event from {self.endpoint}")
        if isinstance(item, BaseException):
            self._pushed.put_nowait(item)  # stays failed for later callers
            raise item
        return item

    async def next_event(self, timeout=...):
        async def go():
            while True:
                f = await self.next_pushed(None)
                if f["type"] == "event":
                    return p.Event.from_wire(f)
                self.notices.append(f)
        return await _bounded(go(), self._timeout(timeout), f"waiting for an event from {self.endpoint}")

    async def wait_final(self, container_ids, timeout=...):
        """``{container_id: final Event}`` for every id (after :meth:`subscribe`)."""
        async def go():
            want, done = set(container_ids), {}
            while want:
                ev = await self.next_event(None)
                if ev.container_id in want and ev.final:
                    done[ev.container_id] = ev
                    want.discard(ev.container_id)
            return done
        return await _bounded(go(), self._timeout(timeout), f"waiting for final events from {self.endpoint}")

    # -- requests -------------------------------------------------------------------------

    async def subscribe(self, timeout=...):
        await self.request({"type": "subscribe"}, "ack", timeout)

    async def allocate_frames(self, container_type, count, cpu_millis, memory_mib, job_id, *,
                              timeout=..., **options):
        """Async iterator over the ``allocated`` frames of one ask (as
        :class:`~hybridsched.Allocation` pieces), ending with the one with ``remaining == 0``.
        ``timeout`` bounds the wait for each frame."""
        rid = await self._submit(p.allocate_frame(container_type, count, cpu_millis, memory_mib,
                                                  job_id, **options))
        try:
            while True:
                ans = await self._take(rid, self._timeout(timeout))
                if ans["type"] != "allocated":
                    raise ProtocolViolation(f"expected 'allocated', got {ans['type']!r}")
                piece = p.Allocation(rid, [p.Grant.from_wire(c) for c in ans.get("containers") or []],
                                     ans.get("unplaced", 0), ans.get("unplaced_reason"),
                                     ans.get("remaining", 0))
                yield piece
                if piece.remaining == 0:
                    return
        finally:
            self._waiters.pop(rid, None)

    async def allocate(self, container_type, count, cpu_millis, memory_mib, job_id, *,
                       timeout=..., **options):
        """All grants of one ask (see the sync :meth:`hybridsched.Client.allocate`);
        ``timeout`` bounds the whole ask."""
        async def go():
            alloc = None
            async for piece in self.allocate_frames(container_type, count, cpu_millis, memory_mib,
                                                    job_id, timeout=None, **options):
                if alloc is None:
                    alloc = piece
                else:
                    alloc.grants += piece.grants
                    alloc.unplaced, alloc.unplaced_reason = piece.unplaced, piece.unplaced_reason
                    alloc.remaining = piece.remaining
            return alloc
        return await _bounded(go(), self._timeout(timeout), f"allocate on {self.endpoint}")

    async def start_container(self, grant, command, args=(), env=None, working_dir=None,
                              timeout=...):
        frame = {"type": "start_container", "token": p.token_of(grant),
                 "launch": p.launch_map(command, args, env, working_dir)}
        return (await self.request(frame, "container_accepted", timeout))["state"]

    async def stop_container(self, container_id, timeout=...):
        await self.request({"type": "stop_container",
                            "container_id": p._uint("container_id", container_id)}, "ack", timeout)

    async def release(self, container_id, timeout=...):
        if isinstance(container_id, p.Grant):
            container_id = container_id.container_id
        await self.request({"type": "release", "container_id": p._uint("container_id", container_id)},
                           "ack", timeout)

    async def promote(self, container_id, timeout=...):
        return (await self.request({"type": "promote",
                                    "container_id": p._uint("container_id", container_id)},
                                   "promoted", timeout))["token"]

    async def reserve(self, reservation_id, definition, timeout=...):
        return (await self.request({"type": "reserve", "reservation_id": reservation_id,
                                    "definition": definition}, "reservation", timeout))["allocation"]

    async def update_reservation(self, reservation_id, definition, timeout=...):
        return (await self.request({"type": "update_reservation", "reservation_id": reservation_id,
                                    "definition": definition}, "reservation", timeout))["allocation"]

    async def delete_reservation(self, reservation_id, timeout=...):
        await self.request({"type": "delete_reservation", "reservation_id": reservation_id},
                           "ack", timeout)

    async def list_reservations(self, timeout=...):
        return await self.request({"type": "list_reservations"}, "reservations", timeout)

    async def explain(self, job_id, timeout=...):
        return await self.request({"type": "explain", "job_id": job_id}, "explained", timeout)


class AsyncClientPool:
    """One subscribed :class:`AsyncClient` per worker endpoint."""

    def __init__(self, app_id, app_secret, *, ca_file=None, timeout=DEFAULT_TIMEOUT):
        self._args = (app_id, app_secret)
        self._kw = {"ca_file": ca_file, "timeout": timeout}
        self._locks = collections.defaultdict(asyncio.Lock)
        self.clients = {}

    async def get(self, endpoint):
        async with self._locks[endpoint]:
            c = self.clients.get(endpoint)
            if c is None:
                c = await AsyncClient.connect(endpoint, *self._args, **self._kw)
                try:
                    await c.subscribe()
                except BaseException:
                    await c.close()
                    raise
                self.clients[endpoint] = c
            return c

    async def start(self, grant, command, args=(), **kw):
        return await (await self.get(grant.node_endpoint)).start_container(grant, command, args, **kw)

    async def wait_final(self, grants, timeout=DEFAULT_TIMEOUT):
        by_ep = collections.defaultdict(list)
        for g in grants:
            by_ep[g.node_endpoint].append(g.container_id)

        async def one(ep, ids):
            return await (await self.get(ep)).wait_final(ids, None)
        parts = await _bounded(asyncio.gather(*(one(ep, ids) for ep, ids in by_ep.items())),
                               timeout, "waiting for final events")
        out = {}
        for part in parts:
            out.update(part)
        return out

    async def close(self):
        for c in list(self.clients.values()):
            await c.close()
        self.clients.clear()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
