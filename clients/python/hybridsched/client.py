"""Synchronous client: one authenticated connection to one worker (docs/protocol.md)."""

import collections
import socket
import ssl
import time

from . import protocol as p
from .errors import (ClientError, ConnectError, ConnectionClosed, ProtocolViolation,
                     RequestTimeout, ServerError)

DEFAULT_TIMEOUT = 30.0
_PUSHED = ("event", "reservation_reprovisioned", "reservation_cancelled")


def open_socket(endpoint, ca_file=None, timeout=DEFAULT_TIMEOUT):
    """A connected (and, for ``tls://``, verified) socket to ``endpoint``."""
    ep = endpoint if isinstance(endpoint, p.Endpoint) else p.Endpoint.parse(endpoint)
    try:
        if ep.kind == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            try:
                s.connect(ep.address)
            except BaseException:
                s.close()
                raise
            return s
        host, port = ep.host_port()
        if ep.kind == "tls" and ca_file is None:
            raise ConnectError(ep.text, "a tls:// endpoint needs the cluster CA (ca_file=.../ca.pem)")
        s = socket.create_connection((host, port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ep.kind == "tls":
            try:
                ctx = ssl.create_default_context(cafile=str(ca_file))  # only the cluster CA
                s = ctx.wrap_socket(s, server_hostname=host)
            except BaseException:
                s.close()
                raise
        return s
    except ClientError:
        raise
    except (OSError, ssl.SSLError) as e:
        raise ConnectError(ep.text, str(e)) from None


class Client:
    """One connection to one worker, ``hello`` done on construction.

    Requests are sent one at a time from one thread; answers are matched by ``request_id``,
    and frames that arrive while waiting for something else (events, answers to other
    requests, later ``allocated`` frames) are kept for later calls. Every wait is bounded by
    ``timeout`` seconds (the constructor's default, or per call; ``None`` waits for ever) and
    raises :class:`RequestTimeout` when it passes. A refused request raises
    :class:`ServerError`.
    """

    def __init__(self, endpoint, app_id, app_secret, *, ca_file=None, client_name="hybridsched-py",
                 timeout=DEFAULT_TIMEOUT):
        self.endpoint = p.Endpoint.parse(endpoint) if not isinstance(endpoint, p.Endpoint) else endpoint
        hello = p.hello_frame(app_id, app_secret, client_name)
        self.timeout = timeout
        self.app_id = app_id
        self._sock = open_socket(self.endpoint, ca_file, timeout)
        self._buf = p.FrameBuffer()
        self._answers = collections.defaultdict(collections.deque)  # request_id -> frames
        self._pushed = collections.deque()  # events and reservation notices
        self._next_id = 1
        self._closed = None
        #: Reservation notices skipped over by next_event (raw maps).
        self.notices = []
        try:
            self._send(hello)
            welcome = self._recv(self._deadline(timeout))
            if welcome["type"] == "error":
                raise ServerError.from_frame(welcome)
            if welcome["type"] != "welcome":
                raise ProtocolViolation(f"expected welcome, got {welcome['type']!r}")
        except BaseException:
            self.close()
            raise
        self.node_id = welcome.get("node_id")
        self.max_frame_bytes = welcome.get("max_frame_bytes", p.MAX_FRAME)

    # -- plumbing -------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._closed = self._closed or "closed by the client"

    def _deadline(self, timeout):
        t = self.timeout if timeout is ... else timeout
        return None if t is None else time.monotonic() + t

    def _send(self, frame):
        if self._sock is None:
            raise ConnectionClosed(self.endpoint.text, self._closed)
        data = p.encode_frame(frame)
        try:
            self._sock.settimeout(self.timeout)
            self._sock.sendall(data)
        except OSError as e:
            self._closed = f"write failed: {e}"
            self.close()
            raise ConnectionClosed(self.endpoint.text, self._closed) from None

    def _recv(self, deadline):
        """The next frame off the wire."""
        while True:
            frame = self._buf.next_frame()
            if frame is not None:
                return frame
            if self._sock is None:
                raise ConnectionClosed(self.endpoint.text, self._closed)
            if deadline is None:
                self._sock.settimeout(None)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeout(f"no frame from {self.endpoint} within the timeout")
                self._sock.settimeout(left)
            try:
                data = self._sock.recv(65536)
            except (socket.timeout, TimeoutError):
                raise RequestTimeout(f"no frame from {self.endpoint} within the timeout") from None
            except OSError as e:
                self._closed = f"read failed: {e}"
                self.close()
                raise ConnectionClosed(self.endpoint.text, self._closed) from None
            if not data:
                self._closed = "the worker closed the connection" + (
                    " in the middle of a frame" if self._buf.partial() else "")
                self.close()
                raise ConnectionClosed(self.endpoint.text, self._closed)
            self._buf.feed(data)

    def _pump(self, deadline):
        """Read one frame and file it: answers by request_id, pushed frames in order."""
        frame = self._recv(deadline)
        if frame["type"] in _PUSHED:
            self._pushed.append(frame)
        elif frame["type"] == "error" and frame.get("request_id") is None:
            # An error answering no readable request (e.g. a malformed frame): the connection
            # is unusable; raise it to whoever is waiting.
            raise ServerError.from_frame(frame)
        else:
            self._answers[frame.get("request_id")].append(frame)

    def submit(self, frame):
        """Send a request with a fresh ``request_id``; return the id (for :meth:`answer`)."""
        rid = self._next_id
        self._next_id += 1
        self._send(dict(frame, request_id=rid))
        return rid

    def answer(self, request_id, timeout=...):
        """The next frame answering ``request_id``; an ``error`` frame raises ServerError."""
        deadline = self._deadline(timeout)
        q = self._answers[request_id]
        while not q:
            self._pump(deadline)
        frame = q.popleft()
        if not q:
            del self._answers[request_id]
        if frame["type"] == "error":
            raise ServerError.from_frame(frame)
        return frame

    def request(self, frame, expect, timeout=...):
        ans = self.answer(self.submit(frame), timeout)
        if ans["type"] != expect:
            raise ProtocolViolation(f"expected {expect!r}, got {ans['type']!r}")
        return ans

    # -- events ---------------------------------------------------------------------------

    def next_pushed(self, timeout=...):
        """The next pushed frame (``event``, ``reservation_reprovisioned``,
        ``reservation_cancelled``) as a raw map."""
        deadline = self._deadline(timeout)
        while not self._pushed:
            self._pump(deadline)
        return self._pushed.popleft()

    def next_event(self, timeout=...):
        """The next container :class:`~hybridsched.Event` (other pushed frames are skipped
        into :attr:`notices`)."""
        deadline = self._deadline(timeout)
        while True:
            f = self.next_pushed(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if f["type"] == "event":
                return p.Event.from_wire(f)
            self.notices.append(f)

    def wait_final(self, container_ids, timeout=...):
        """Wait for the final event (``completed`` or ``killed``) of every container in
        ``container_ids``; return ``{container_id: Event}``. Events of other containers are
        dropped. Needs :meth:`subscribe` on this (the hosting worker's) connection first."""
        deadline = self._deadline(timeout)
        want = set(container_ids)
        done = {}
        while want:
            ev = self.next_event(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if ev.container_id in want and ev.final:
                done[ev.container_id] = ev
                want.discard(ev.container_id)
        return done

    # -- requests -------------------------------------------------------------------------

    def subscribe(self, timeout=...):
        self.request({"type": "subscribe"}, "ack", timeout)

    def allocate(self, container_type, count, cpu_millis, memory_mib, job_id, *, timeout=...,
                 **options):
        """Ask for ``count`` containers; return an :class:`~hybridsched.Allocation` once the
        ask is answered in full: QUEUEABLE after its one frame (check ``unplaced``),
        GUARANTEED once the last frame (``remaining == 0``) arrived, which may take until
        capacity frees up: pass ``timeout=None`` to wait without bound. Options: priority,
        runtime_estimate_ms, job_submit_time_ms, nodes, racks, relax, reservation_id, role
        ("core" or "elastic") and allow_shaping (GUARANTEED: the resource shaper may resize
        and preempt the containers, docs/protocol.md §6.6)."""
        rid = self.submit(p.allocate_frame(container_type, count, cpu_millis, memory_mib, job_id,
                                           **options))
        deadline = self._deadline(timeout)
        alloc = p.Allocation(rid, [])
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                ans = self.answer(rid, left)
            except RequestTimeout:
                raise RequestTimeout(
                    f"allocate {rid}: {len(alloc.grants)} of {count} granted within the timeout; "
                    "grants so far: " + ", ".join(str(g.container_id) for g in alloc.grants)) from None
            if ans["type"] != "allocated":
                raise ProtocolViolation(f"expected 'allocated', got {ans['type']!r}")
            alloc.grants += [p.Grant.from_wire(c) for c in ans.get("containers") or []]
            alloc.unplaced = ans.get("unplaced", 0)
            alloc.unplaced_reason = ans.get("unplaced_reason")
            alloc.remaining = ans.get("remaining", 0)
            if alloc.remaining == 0:
                return alloc

    def allocate_frames(self, container_type, count, cpu_millis, memory_mib, job_id, *,
                        timeout=..., **options):
        """Iterator over the ``allocated`` frames of one ask, as :class:`~hybridsched.Allocation`
        pieces, ending with the one with ``remaining == 0`` (a GUARANTEED ask's grants as each
        scheduling round makes them). ``timeout`` bounds the wait for each frame. The ask is
        sent at once, before the first ``next()``."""
        rid = self.submit(p.allocate_frame(container_type, count, cpu_millis, memory_mib, job_id,
                                           **options))

        def frames():
            while True:
                ans = self.answer(rid, timeout)
                if ans["type"] != "allocated":
                    raise ProtocolViolation(f"expected 'allocated', got {ans['type']!r}")
                piece = p.Allocation(rid, [p.Grant.from_wire(c) for c in ans.get("containers") or []],
                                     ans.get("unplaced", 0), ans.get("unplaced_reason"),
                                     ans.get("remaining", 0))
                yield piece
                if piece.remaining == 0:
                    return
        return frames()

    def start_container(self, grant, command, args=(), env=None, working_dir=None, timeout=...):
        """Start a grant (send it to the grant's ``node_endpoint`` worker); returns the
        accepted state, ``running`` or ``queued``."""
        frame = {"type": "start_container", "token": p.token_of(grant),
                 "launch": p.launch_map(command, args, env, working_dir)}
        return self.request(frame, "container_accepted", timeout)["state"]

    def stop_container(self, container_id, timeout=...):
        self.request({"type": "stop_container", "container_id": p._uint("container_id", container_id)},
                     "ack", timeout)

    def release(self, container_id, timeout=...):
        if isinstance(container_id, p.Grant):
            container_id = container_id.container_id
        self.request({"type": "release", "container_id": p._uint("container_id", container_id)},
                     "ack", timeout)

    def promote(self, container_id, timeout=...):
        """Make a QUEUEABLE container GUARANTEED; returns the new token (a receipt)."""
        return self.request({"type": "promote", "container_id": p._uint("container_id", container_id)},
                            "promoted", timeout)["token"]

    def reserve(self, reservation_id, definition, timeout=...):
        """``definition`` is the ReservationDefinition map of §5.8; returns the allocation."""
        return self.request({"type": "reserve", "reservation_id": reservation_id,
                             "definition": definition}, "reservation", timeout)["allocation"]

    def update_reservation(self, reservation_id, definition, timeout=...):
        return self.request({"type": "update_reservation", "reservation_id": reservation_id,
                             "definition": definition}, "reservation", timeout)["allocation"]

    def delete_reservation(self, reservation_id, timeout=...):
        self.request({"type": "delete_reservation", "reservation_id": reservation_id}, "ack", timeout)

    def list_reservations(self, timeout=...):
        """The ``reservations`` frame (keys ``reservations`` and ``free``)."""
        return self.request({"type": "list_reservations"}, "reservations", timeout)

    def explain(self, job_id, timeout=...):
        """The ``explained`` frame for the app's waiting 3Sigma job ``job_id`` (key ``jobs``:
        its runtime distribution, the options the last cycle considered and why it waits)."""
        return self.request({"type": "explain", "job_id": job_id}, "explained", timeout)


class ClientPool:
    """One subscribed :class:`Client` per worker endpoint, for starting containers on the
    node named in their grant and following their events there."""

    def __init__(self, app_id, app_secret, *, ca_file=None, timeout=DEFAULT_TIMEOUT):
        self._args = (app_id, app_secret)
        self._kw = {"ca_file": ca_file, "timeout": timeout}
        self.clients = {}

    def get(self, endpoint):
        c = self.clients.get(endpoint)
        if c is None:
            c = Client(endpoint, *self._args, **self._kw)
            try:
                c.subscribe()
            except BaseException:
                c.close()
                raise
            self.clients[endpoint] = c
        return c

    def start(self, grant, command, args=(), **kw):
        return self.get(grant.node_endpoint).start_container(grant, command, args, **kw)

    def wait_final(self, grants, timeout=DEFAULT_TIMEOUT):
        """Final events of ``grants`` (started through this pool), ``{container_id: Event}``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        by_ep = collections.defaultdict(list)
        for g in grants:
            by_ep[g.node_endpoint].append(g.container_id)
        out = {}
        for ep, ids in by_ep.items():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            out.update(self.get(ep).wait_final(ids, left))
        return out

    def close(self):
        for c in self.clients.values():
            c.close()
        self.clients.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
