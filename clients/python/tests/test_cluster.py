"""Against a real local cluster (conftest.LocalCluster), once per app transport."""

import os
import pathlib
import subprocess
import sys

import pytest

import hybridsched as hs

TIMEOUT = 30.0  # bound on every wait for a frame or an event


def client(cluster, endpoint=None, secret=None):
    return hs.Client(endpoint or cluster.endpoint, cluster.app_id,
                     cluster.app_secret if secret is None else secret,
                     ca_file=cluster.ca_file, timeout=TIMEOUT)


def test_welcome(cluster):
    with client(cluster) as c:
        assert c.node_id == cluster.workers[0]["node_id"]
        assert c.max_frame_bytes == hs.MAX_FRAME


def test_queueable_container_runs_to_completion(cluster):
    with client(cluster) as local, hs.ClientPool(cluster.app_id, cluster.app_secret,
                                                 ca_file=cluster.ca_file, timeout=TIMEOUT) as pool:
        alloc = local.allocate("QUEUEABLE", 1, 200, 64, "py-q", runtime_estimate_ms=1000)
        assert len(alloc.grants) + alloc.unplaced == 1
        assert len(alloc.grants) == 1, alloc.unplaced_reason
        g = alloc.grants[0]
        assert g.container_type == "QUEUEABLE"
        assert g.node_endpoint in {w["app_endpoint"] for w in cluster.workers}
        assert pool.start(g, "sh", ["-c", "exit 0"]) in ("running", "queued")
        ev = pool.wait_final([g], timeout=TIMEOUT)[g.container_id]
        assert (ev.kind, ev.exit_code) == ("completed", 0)


def test_guaranteed_containers_start_complete_and_release(cluster):
    with client(cluster) as local, hs.ClientPool(cluster.app_id, cluster.app_secret,
                                                 ca_file=cluster.ca_file, timeout=TIMEOUT) as pool:
        alloc = local.allocate("GUARANTEED", 2, 500, 128, "py-g", timeout=TIMEOUT)
        assert [g.container_type for g in alloc.grants] == ["GUARANTEED"] * 2
        run, spare = alloc.grants
        assert pool.start(run, "sh", ["-c", "exit 3"]) == "running"
        ev = pool.wait_final([run], timeout=TIMEOUT)[run.container_id]
        assert (ev.kind, ev.exit_code) == ("completed", 3)
        local.release(spare)  # never started: frees the booking
        # The used token is refused the second time, with the typed error.
        with pytest.raises(hs.ServerError) as e:
            pool.start(run, "sh", ["-c", "exit 0"])
        assert e.value.code == "invalid_token" and not e.value.retryable
        assert e.value.request_id is not None


def test_release_of_a_running_container_kills_it(cluster):
    with client(cluster) as local, hs.ClientPool(cluster.app_id, cluster.app_secret,
                                                 ca_file=cluster.ca_file, timeout=TIMEOUT) as pool:
        g = local.allocate("GUARANTEED", 1, 100, 64, "py-rel").grants[0]
        pool.start(g, "sh", ["-c", "exec sleep 600"])
        local.release(g)
        ev = pool.wait_final([g], timeout=TIMEOUT)[g.container_id]
        assert (ev.kind, ev.reason) == ("killed", "released")


def test_bad_secret_raises_bad_credentials(cluster):
    with pytest.raises(hs.ServerError) as e:
        client(cluster, secret="not-the-secret")
    err = e.value
    assert err.code == "bad_credentials"
    assert err.retryable is False
    assert err.request_id is None
    assert err.message
    assert cluster.app_secret not in str(err) + repr(err)


def test_errors_after_hello_leave_the_connection_open(cluster):
    with client(cluster) as c:
        with pytest.raises(hs.ServerError) as e:
            c.allocate("QUEUEABLE", 1, 10**9, 64, "too-big")
        assert e.value.code == "ask_too_large" and not e.value.retryable
        assert e.value.request_id is not None
        with pytest.raises(hs.ServerError) as e:
            c.release(123456789)
        assert e.value.code == "unknown_container"
        c.subscribe()  # still usable


def test_waiting_is_bounded(cluster):
    with client(cluster) as c:
        c.subscribe()
        with pytest.raises(hs.RequestTimeout):
            c.next_event(timeout=0.2)  # nothing of ours runs on it
        c.subscribe()  # still in sync after the timeout


def test_job_manager_example(cluster):
    example = pathlib.Path(__file__).resolve().parents[1] / "examples" / "job_manager.py"
    env = dict(os.environ, HYBRID_APP_SECRET=cluster.app_secret)
    out = subprocess.run(
        [sys.executable, str(example), cluster.endpoint, cluster.app_id, "--ca-file",
         cluster.ca_file, "--tasks", "3", "--timeout", str(TIMEOUT)],
        env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert cluster.app_secret not in out.stdout + out.stderr
    assert "all 3 tasks done" in out.stdout


def test_guaranteed_ask_beyond_capacity_arrives_in_several_frames(cluster):
    # 5 x 1000 millicores on 2 x 2000: never all at once. Each time a frame leaves part of
    # the ask waiting, run one granted container to completion so capacity frees up.
    with client(cluster) as local, hs.ClientPool(cluster.app_id, cluster.app_secret,
                                                 ca_file=cluster.ca_file, timeout=TIMEOUT) as pool:
        frames = local.allocate_frames("GUARANTEED", 5, 1000, 64, "py-multi", timeout=TIMEOUT)
        granted, unstarted, pieces = [], [], []
        for piece in frames:
            pieces.append(piece)
            granted += piece.grants
            unstarted += piece.grants
            if piece.remaining == 0:
                break
            if unstarted:
                g = unstarted.pop(0)
                pool.start(g, "sh", ["-c", "exit 0"])
                assert pool.wait_final([g], timeout=TIMEOUT)[g.container_id].kind == "completed"
        assert len(granted) == 5 and len({g.container_id for g in granted}) == 5
        assert len(pieces) >= 2 and pieces[0].remaining > 0
        assert {pc.request_id for pc in pieces} == {pieces[0].request_id}
        for g in unstarted:
            local.release(g)


def test_explain_of_a_job_that_does_not_wait_is_empty(cluster):
    with client(cluster) as c:
        frame = c.explain("py-no-such-job")
        assert frame["type"] == "explained"
        assert frame["jobs"] == []
