"""Framing, endpoints and request builders of the application protocol (docs/protocol.md)."""

import dataclasses
import struct
import time

import msgpack

from .errors import ProtocolViolation

PROTOCOL_VERSION = 1
#: Cap on a frame's payload, both directions (§2).
MAX_FRAME = 1 << 20
CONTAINER_TYPES = ("GUARANTEED", "QUEUEABLE")
#: Event kinds after which a container is gone (§7.6).
FINAL_KINDS = ("completed", "killed")
MAX_COUNT = 1000

_LEN = struct.Struct(">I")


def encode_frame(frame):
    """4-byte big-endian payload length + one msgpack map (§2)."""
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise ValueError("a frame is a dict with a string 'type'")
    payload = msgpack.packb(frame, use_bin_type=True)
    if len(payload) > MAX_FRAME:
        raise ValueError(f"frame payload is {len(payload)} bytes; the cap is {MAX_FRAME}")
    return _LEN.pack(len(payload)) + payload


def decode_payload(payload):
    try:
        frame = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types
        raise ProtocolViolation(f"undecodable frame from the worker: {e}") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise ProtocolViolation("frame from the worker is not a map with a string 'type'")
    return frame


class FrameBuffer:
    """Accumulates received bytes and cuts them into frames."""

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data):
        self._buf += data

    def next_frame(self):
        """The next complete frame, or None."""
        if len(self._buf) < 4:
            return None
        (length,) = _LEN.unpack_from(self._buf)
        if length > MAX_FRAME:
            raise ProtocolViolation(f"the worker announced a {length}-byte frame; the cap is {MAX_FRAME}")
        if len(self._buf) < 4 + length:
            return None
        payload = bytes(self._buf[4:4 + length])
        del self._buf[:4 + length]
        return decode_payload(payload)

    def partial(self):
        return len(self._buf) > 0


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A worker's app endpoint (§1): ``kind`` is ``unix``, ``tcp`` or ``tls``."""

    kind: str
    address: str  # the socket path (unix) or HOST:PORT
    text: str

    @classmethod
    def parse(cls, endpoint):
        """``unix:///PATH`` (also ``unix:PATH`` or a path starting with ``/`` or ``.``),
        ``tcp://HOST:PORT``, ``tls://HOST:PORT``; a bare ``HOST:PORT`` is plaintext TCP."""
        if not isinstance(endpoint, str) or not endpoint:
            raise ValueError(f"an endpoint is a non-empty string, not {endpoint!r}")
        if endpoint.startswith("tls://"):
            kind, addr = "tls", endpoint[len("tls://"):]
        elif endpoint.startswith("tcp://"):
            kind, addr = "tcp", endpoint[len("tcp://"):]
        elif endpoint.startswith("unix://"):
            kind, addr = "unix", endpoint[len("unix://"):]
        elif endpoint.startswith("unix:"):
            kind, addr = "unix", endpoint[len("unix:"):]
        elif endpoint.startswith(("/", ".")):
            kind, addr = "unix", endpoint
        elif "://" in endpoint:
            raise ValueError(f"unknown endpoint scheme in {endpoint!r} (unix://, tcp:// or tls://)")
        else:
            kind, addr = "tcp", endpoint
        if kind != "unix":
            cls._host_port(addr, endpoint)
        elif not addr:
            raise ValueError(f"no socket path in {endpoint!r}")
        return cls(kind, addr, endpoint)

    @staticmethod
    def _host_port(addr, endpoint):
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"endpoint {endpoint!r} is not HOST:PORT")
        return host.strip("[]"), int(port)

    def host_port(self):
        return self._host_port(self.address, self.text)

    def __str__(self):
        return self.text


@dataclasses.dataclass(frozen=True)
class Grant:
    """One granted container (§7.2 ``GrantedContainer``). ``token`` is opaque: pass it back."""

    container_id: int
    node_id: str
    node_endpoint: str
    container_type: str
    resources: dict
    token: dict

    @classmethod
    def from_wire(cls, m):
        return cls(m["container_id"], m["node_id"], m["node_endpoint"], m["container_type"],
                   dict(m["resources"]), m["token"])


@dataclasses.dataclass
class Allocation:
    """All grants of one ``allocate`` (every ``allocated`` frame of it)."""

    request_id: int
    grants: list
    unplaced: int = 0
    unplaced_reason: object = None
    remaining: int = 0


@dataclasses.dataclass(frozen=True)
class Event:
    """A container event (§7.6); ``kind`` is ``queued``, ``running``, ``completed``,
    ``killed`` or ``promoted``; ``detail`` is the whole ``event`` map (``exit_code``,
    ``reason``, ``message``, ``version``)."""

    container_id: int
    node_id: str
    kind: str
    detail: dict
    at_ms: int

    @classmethod
    def from_wire(cls, f):
        ev = f.get("event") or {}
        return cls(f.get("container_id"), f.get("node_id"), ev.get("kind"), ev, f.get("at_ms"))

    @property
    def final(self):
        return self.kind in FINAL_KINDS

    @property
    def exit_code(self):
        return self.detail.get("exit_code")

    @property
    def reason(self):
        return self.detail.get("reason")


def _uint(name, v, lo=0, hi=(1 << 64) - 1):
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {v!r}")
    return v


def resources_map(cpu_millis, memory_mib):
    _uint("cpu_millis", cpu_millis)
    _uint("memory_mib", memory_mib)
    if cpu_millis == 0 and memory_mib == 0:
        raise ValueError("an ask needs cpu_millis or memory_mib above zero")
    return {"cpu_millis": cpu_millis, "memory_mib": memory_mib}


def hello_frame(app_id, app_secret, client_name=None):
    for name, v in (("app_id", app_id), ("app_secret", app_secret)):
        if not isinstance(v, str) or not v:
            raise ValueError(f"{name} must be a non-empty string")
    f = {"type": "hello", "protocol_version": PROTOCOL_VERSION, "app_id": app_id,
         "app_secret": app_secret}
    if client_name is not None:
        f["client_name"] = str(client_name)
    return f


def allocate_frame(container_type, count, cpu_millis, memory_mib, job_id, *,
                   job_submit_time_ms=None, priority=None, runtime_estimate_ms=None,
                   nodes=None, racks=None, relax=None, reservation_id=None, role=None,
                   allow_shaping=None, job=None):
    if container_type not in CONTAINER_TYPES:
        raise ValueError(f"container_type must be one of {CONTAINER_TYPES}, not {container_type!r}")
    _uint("count", count, 1, MAX_COUNT)
    if not isinstance(job_id, str) or not job_id:
        raise ValueError("job_id must be a non-empty string")
    f = {"type": "allocate", "resources": resources_map(cpu_millis, memory_mib),
         "count": count, "container_type": container_type, "job_id": job_id,
         "job_submit_time_ms": _uint("job_submit_time_ms", job_submit_time_ms)
         if job_submit_time_ms is not None else int(time.time() * 1000)}
    if priority is not None:
        f["priority"] = _uint("priority", priority, 0, (1 << 32) - 1)
    if runtime_estimate_ms is not None:
        f["runtime_estimate_ms"] = _uint("runtime_estimate_ms", runtime_estimate_ms)
    if nodes or racks or relax:
        f["locality"] = {"nodes": list(nodes or []), "racks": list(racks or []),
                         "relax": bool(relax)}
    if reservation_id is not None:
        if container_type != "GUARANTEED":
            raise ValueError("reservation_id is for GUARANTEED asks only")
        f["reservation_id"] = str(reservation_id)
    if role is not None:
        if role not in ("core", "elastic"):
            raise ValueError(f"role must be 'core' or 'elastic', not {role!r}")
        f["role"] = role
    if allow_shaping is not None:
        if not isinstance(allow_shaping, bool):
            raise ValueError("allow_shaping must be a bool")
        f["allow_shaping"] = allow_shaping
    if job is not None:
        if container_type != "GUARANTEED" or reservation_id is not None:
            raise ValueError("job is for GUARANTEED asks outside reservations only")
        f["job"] = job_spec(**job) if isinstance(job, dict) and "utility" not in job else job
    return f


def job_spec(*, deadline_ms=None, value=1.0, zero_after_ms=None, features=None,
             required=None, preferred=None, non_preferred_slowdown=None):
    """A 3Sigma job description (docs/protocol.md §6.7): an SLO job (``deadline_ms``, ms since
    the Unix epoch) or a latency-sensitive best-effort job (``zero_after_ms``: its value decays
    linearly to zero that long after submission). ``features`` (str → str, e.g. ``name``) key
    3σPredict's runtime history; ``required`` / ``preferred`` map a node attribute to its
    allowed values."""
    if (deadline_ms is None) == (zero_after_ms is None):
        raise ValueError("give exactly one of deadline_ms (SLO job) or zero_after_ms (best effort)")
    if not (isinstance(value, (int, float)) and value > 0):
        raise ValueError("value must be a positive number")
    if deadline_ms is not None:
        utility = {"kind": "slo", "deadline_ms": _uint("deadline_ms", deadline_ms),
                   "value": float(value)}
    else:
        utility = {"kind": "best_effort", "value": float(value),
                   "zero_after_ms": _uint("zero_after_ms", zero_after_ms, 1)}
    spec = {"utility": utility}
    if features:
        if len(features) > 16 or not all(isinstance(k, str) and isinstance(v, str)
                                         and len(k.encode()) <= 128 and len(v.encode()) <= 128
                                         for k, v in dict(features).items()):
            raise ValueError("features: at most 16 str → str entries of at most 128 bytes")
        spec["features"] = dict(features)
    for name, given in (("required", required), ("preferred", preferred)):
        if given:
            spec[name] = [{"key": str(k), "values": [str(v) for v in (vs if isinstance(vs, (list, tuple)) else [vs])]}
                          for k, vs in dict(given).items()]
    if non_preferred_slowdown is not None:
        if not (isinstance(non_preferred_slowdown, (int, float)) and non_preferred_slowdown >= 1):
            raise ValueError("non_preferred_slowdown must be ≥ 1")
        spec["non_preferred_slowdown"] = float(non_preferred_slowdown)
    return spec


def launch_map(command, args=(), env=None, working_dir=None):
    if not isinstance(command, str) or not command:
        raise ValueError("command must be a non-empty string")
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise ValueError("args must be a list of strings")
    launch = {"command": command, "args": list(args)}
    if env is not None:
        if not all(isinstance(k, str) and k and "=" not in k and isinstance(v, str)
                   for k, v in dict(env).items()):
            raise ValueError("env must map non-empty names without '=' to strings")
        launch["env"] = dict(env)
    if working_dir is not None:
        launch["working_dir"] = str(working_dir)
    return launch


def token_of(grant_or_token):
    if isinstance(grant_or_token, Grant):
        return grant_or_token.token
    if isinstance(grant_or_token, dict) and "body" in grant_or_token and "signature" in grant_or_token:
        return grant_or_token
    raise ValueError("expected a Grant or a token map {body, signature}")
