"""Fixtures: a real local cluster (`testbed local`) started from the built binaries.

The binary is $HYBRID_TESTBED_BIN, else $CARGO_TARGET_DIR/debug/testbed, else
<repo>/target/debug/testbed (build it with `cargo build -p testbed -p coordinator -p worker`).
"""

import ctypes
import json
import os
import pathlib
import selectors
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package, without installing it

REPO = HERE.parents[2]
READY_TIMEOUT_S = float(os.environ.get("HYBRID_READY_TIMEOUT_S", "120"))
TRANSPORTS = ("unix", "plaintext-tcp", "tls")


def testbed_binary():
    explicit = os.environ.get("HYBRID_TESTBED_BIN")
    if explicit:
        path = pathlib.Path(explicit)
    else:
        target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
        if not target.is_absolute():
            target = REPO / target
        path = target / "debug" / "testbed"
    if not path.is_file():
        pytest.fail(f"no testbed binary at {path}: run `cargo build -p testbed -p coordinator "
                    "-p worker` first (or set HYBRID_TESTBED_BIN)", pytrace=False)
    return path


def _die_with_parent():
    """In the child before exec: SIGTERM when the test process dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG; testbed local then stops its coordinator and workers)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


class LocalCluster:
    """`testbed local` as a subprocess; `info` is its JSON line (holds the app secret: never
    print it)."""

    def __init__(self, transport, workers=2):
        self.log = tempfile.NamedTemporaryFile(prefix=f"testbed-local-{transport}-", suffix=".log",
                                               delete=False)
        self.proc = subprocess.Popen(
            [str(testbed_binary()), "local", "--workers", str(workers), "--app-transport", transport,
             "--cpu-millis", "2000", "--memory-mib", "2048"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log,
            preexec_fn=_die_with_parent)
        try:
            self.info = json.loads(self._ready_line())
        except BaseException:
            self.stop()
            raise
        self.transport = transport
        self.app_id = self.info["app_id"]
        self.app_secret = self.info["app_secret"]
        self.ca_file = self.info["ca_cert"]
        self.workers = self.info["workers"]
        self.endpoint = self.workers[0]["app_endpoint"]

    def _ready_line(self):
        deadline = time.monotonic() + READY_TIMEOUT_S
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        buf = b""
        try:
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"testbed local printed no JSON line in {READY_TIMEOUT_S} s; "
                                       f"log: {self.log.name}")
                if not sel.select(left):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    raise RuntimeError(f"testbed local exited ({self.proc.wait()}) before its JSON "
                                       f"line; log: {self.log.name}")
                buf += chunk
        finally:
            sel.close()
        return buf.split(b"\n", 1)[0].decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc.stdout.close()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="session", params=TRANSPORTS)
def cluster(request):
    c = LocalCluster(request.param)
    yield c
    rc = c.stop()
    assert rc == 0, f"testbed local exited with {rc}; log: {c.log.name}"
    os.unlink(c.log.name)
