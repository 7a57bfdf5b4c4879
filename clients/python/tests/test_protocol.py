"""Offline tests: framing and argument checks (no cluster)."""

import pytest

import hybridsched as hs
from hybridsched import protocol as p

# docs/protocol.md §12, frame:hello
HELLO_HEX = """
00 00 00 54 85 a4 74 79 70 65 a5 68 65 6c 6c 6f b0 70 72 6f 74 6f 63 6f 6c 5f 76 65 72 73 69 6f
6e 01 a6 61 70 70 5f 69 64 a4 64 65 6d 6f aa 61 70 70 5f 73 65 63 72 65 74 a6 73 33 63 72 65 74
ab 63 6c 69 65 6e 74 5f 6e 61 6d 65 ab 65 78 61 6d 70 6c 65 2f 31 2e 30"""

# docs/protocol.md §12, frame:error
ERROR_HEX = """
00 00 00 5f 85 a4 74 79 70 65 a5 65 72 72 6f 72 aa 72 65 71 75 65 73 74 5f 69 64 c0 a4 63 6f 64
65 ae 68 65 6c 6c 6f 5f 72 65 71 75 69 72 65 64 a7 6d 65 73 73 61 67 65 bf 74 68 65 20 66 69 72
73 74 20 66 72 61 6d 65 20 6d 75 73 74 20 62 65 20 61 20 68 65 6c 6c 6f a9 72 65 74 72 79 61 62
6c 65 c2"""


def test_hello_frame_bytes_match_the_spec():
    frame = p.hello_frame("demo", "s3cret", "example/1.0")
    assert hs.encode_frame(frame) == bytes.fromhex(HELLO_HEX)


def test_error_frame_decodes_to_typed_error():
    buf = p.FrameBuffer()
    data = bytes.fromhex(ERROR_HEX)
    buf.feed(data[:10])
    assert buf.next_frame() is None  # partial frame
    buf.feed(data[10:])
    err = hs.ServerError.from_frame(buf.next_frame())
    assert (err.code, err.retryable, err.request_id) == ("hello_required", False, None)
    assert err.message == "the first frame must be a hello"
    assert buf.next_frame() is None


def test_oversized_announced_frame_is_refused():
    buf = p.FrameBuffer()
    buf.feed((hs.MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(hs.ProtocolViolation):
        buf.next_frame()


@pytest.mark.parametrize("text,kind,addr", [
    ("unix:///tmp/w.sock", "unix", "/tmp/w.sock"),
    ("/tmp/w.sock", "unix", "/tmp/w.sock"),
    ("tcp://127.0.0.1:7501", "tcp", "127.0.0.1:7501"),
    ("127.0.0.1:7501", "tcp", "127.0.0.1:7501"),
    ("tls://[::1]:7501", "tls", "[::1]:7501"),
])
def test_endpoints(text, kind, addr):
    ep = hs.Endpoint.parse(text)
    assert (ep.kind, ep.address) == (kind, addr)


@pytest.mark.parametrize("bad", ["", "http://x:1", "tcp://nohost", "tcp://h:0", "unix://", 7])
def test_bad_endpoints(bad):
    with pytest.raises(ValueError):
        hs.Endpoint.parse(bad)


def test_bad_requests_are_refused_before_sending():
    with pytest.raises(ValueError, match="container_type"):
        p.allocate_frame("BESTEFFORT", 1, 100, 64, "j")
    with pytest.raises(ValueError, match="count"):
        p.allocate_frame("QUEUEABLE", 0, 100, 64, "j")
    with pytest.raises(ValueError, match="above zero"):
        p.allocate_frame("QUEUEABLE", 1, 0, 0, "j")
    with pytest.raises(ValueError, match="reservation_id"):
        p.allocate_frame("QUEUEABLE", 1, 100, 64, "j", reservation_id="r")
    with pytest.raises(ValueError, match="role"):
        p.allocate_frame("GUARANTEED", 1, 100, 64, "j", role="spare")
    with pytest.raises(ValueError, match="allow_shaping"):
        p.allocate_frame("GUARANTEED", 1, 100, 64, "j", allow_shaping="yes")
    with pytest.raises(ValueError, match="command"):
        p.launch_map("")
    with pytest.raises(ValueError, match="args"):
        p.launch_map("sh", "-c exit")


def test_shaping_options_go_on_the_wire_only_when_given():
    f = p.allocate_frame("GUARANTEED", 1, 100, 64, "j", role="elastic", allow_shaping=True)
    assert (f["role"], f["allow_shaping"]) == ("elastic", True)
    f = p.allocate_frame("GUARANTEED", 1, 100, 64, "j")
    assert "role" not in f and "allow_shaping" not in f


def test_job_description_goes_on_the_wire_as_the_spec_says():
    f = p.allocate_frame("GUARANTEED", 2, 1000, 512, "etl-1",
                         job={"deadline_ms": 1_700_000_060_000, "value": 2,
                              "features": {"name": "etl"}, "required": {"gpu": "yes"}})
    assert f["job"] == {"utility": {"kind": "slo", "deadline_ms": 1_700_000_060_000, "value": 2.0},
                        "features": {"name": "etl"},
                        "required": [{"key": "gpu", "values": ["yes"]}]}
    be = p.job_spec(zero_after_ms=60_000)
    assert be["utility"] == {"kind": "best_effort", "value": 1.0, "zero_after_ms": 60_000}
    with pytest.raises(ValueError, match="exactly one"):
        p.job_spec(deadline_ms=1, zero_after_ms=1)
    with pytest.raises(ValueError, match="GUARANTEED"):
        p.allocate_frame("QUEUEABLE", 1, 100, 64, "j", job=be)
    assert "job" not in p.allocate_frame("GUARANTEED", 1, 100, 64, "j")


def test_tls_needs_a_ca():
    with pytest.raises(hs.ConnectError, match="cluster CA"):
        hs.Client("tls://127.0.0.1:1", "demo", "x")


def test_unreachable_endpoint_is_a_connect_error(tmp_path):
    with pytest.raises(hs.ConnectError) as e:
        hs.Client(f"unix://{tmp_path}/none.sock", "demo", "x")
    assert e.value.retryable
