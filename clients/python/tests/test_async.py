"""The asyncio client against the same real clusters (conftest), once per app transport."""

import asyncio

import pytest

import hybridsched as hs

TIMEOUT = 30.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def connect(cluster, secret=None):
    return hs.AsyncClient.connect(cluster.endpoint, cluster.app_id,
                                  cluster.app_secret if secret is None else secret,
                                  ca_file=cluster.ca_file, timeout=TIMEOUT)


def pool(cluster):
    return hs.AsyncClientPool(cluster.app_id, cluster.app_secret, ca_file=cluster.ca_file,
                              timeout=TIMEOUT)


def test_async_queueable_and_guaranteed_run_to_completion(cluster):
    async def go():
        async with await connect(cluster) as local, pool(cluster) as hosts:
            assert local.node_id == cluster.workers[0]["node_id"]
            q, g = await asyncio.gather(
                local.allocate("QUEUEABLE", 1, 200, 64, "py-aq", runtime_estimate_ms=1000),
                local.allocate("GUARANTEED", 2, 300, 64, "py-ag"))
            assert len(q.grants) == 1, q.unplaced_reason
            assert [x.container_type for x in g.grants] == ["GUARANTEED"] * 2
            grants = q.grants + g.grants
            states = await asyncio.gather(*(hosts.start(x, "sh", ["-c", f"exit {i}"])
                                            for i, x in enumerate(grants)))
            assert set(states) <= {"running", "queued"}
            finals = await hosts.wait_final(grants, timeout=TIMEOUT)
            assert [(finals[x.container_id].kind, finals[x.container_id].exit_code)
                    for x in grants] == [("completed", 0), ("completed", 1), ("completed", 2)]
    run(go())


def test_async_allocate_frames_and_release(cluster):
    async def go():
        async with await connect(cluster) as local:
            pieces = [a async for a in local.allocate_frames("GUARANTEED", 1, 100, 64, "py-af")]
            assert pieces[-1].remaining == 0
            (grant,) = [x for piece in pieces for x in piece.grants]
            await local.release(grant)
    run(go())


def test_async_bad_secret_raises_bad_credentials(cluster):
    async def go():
        with pytest.raises(hs.ServerError) as e:
            await connect(cluster, secret="not-the-secret")
        return e.value
    err = run(go())
    assert (err.code, err.retryable, err.request_id) == ("bad_credentials", False, None)
    assert cluster.app_secret not in str(err) + repr(err)


def test_async_errors_and_timeouts(cluster):
    async def go():
        async with await connect(cluster) as c:
            with pytest.raises(hs.ServerError) as e:
                await c.allocate("QUEUEABLE", 1, 10**9, 64, "too-big")
            assert e.value.code == "ask_too_large" and e.value.request_id is not None
            await c.subscribe()
            with pytest.raises(hs.RequestTimeout):
                await c.next_event(timeout=0.2)
            await c.subscribe()
    run(go())
