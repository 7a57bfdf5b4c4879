#!/usr/bin/env python3
"""A small job manager: run N tasks in containers, then give everything back.

    HYBRID_APP_SECRET=... python3 examples/job_manager.py ENDPOINT APP_ID [--ca-file ca.pem]
        [--tasks N] [--type mixed|QUEUEABLE|GUARANTEED] [--timeout S] [-- COMMAND ARG...]

ENDPOINT is the local worker's app endpoint (unix:///PATH, tcp://HOST:PORT, tls://HOST:PORT).
The secret is read from $HYBRID_APP_SECRET (never from the command line, never printed).
Each task gets TASK=<index> in its environment. Tasks alternate QUEUEABLE and GUARANTEED with
--type mixed; QUEUEABLE containers that are shed or preempted are asked for again.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import hybridsched as hs  # noqa: E402

MAX_ATTEMPTS = 5


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("endpoint")
    ap.add_argument("app_id")
    ap.add_argument("--ca-file")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--type", default="mixed", choices=["mixed", "QUEUEABLE", "GUARANTEED"])
    ap.add_argument("--cpu-millis", type=int, default=250)
    ap.add_argument("--memory-mib", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=60.0, help="bound on each wait, seconds")
    argv = sys.argv[1:] if argv is None else list(argv)
    command = ["sh", "-c", 'echo "task $TASK"; exit 0']
    if "--" in argv:  # everything after `--` is the task's command
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
        if not command:
            ap.error("no command after --")
    a = ap.parse_args(argv)
    a.command = command
    secret = os.environ.get("HYBRID_APP_SECRET")
    if not secret:
        ap.error("set HYBRID_APP_SECRET to the app's secret")
    if a.tasks < 1:
        ap.error("--tasks must be at least 1")

    job = f"jm-{os.getpid()}-{int(time.time())}"
    kinds = {i: (a.type if a.type != "mixed" else ("QUEUEABLE", "GUARANTEED")[i % 2])
             for i in range(a.tasks)}
    attempts = dict.fromkeys(kinds, 0)
    results = {}
    with hs.Client(a.endpoint, a.app_id, secret, ca_file=a.ca_file, timeout=a.timeout) as local, \
            hs.ClientPool(a.app_id, secret, ca_file=a.ca_file, timeout=a.timeout) as pool:
        print(f"job {job}: {a.tasks} tasks through {local.node_id}")
        pending = list(kinds)
        while pending:
            running = {}  # container_id -> (task, grant)
            for ctype in ("QUEUEABLE", "GUARANTEED"):
                todo = [t for t in pending if kinds[t] == ctype]
                while todo:
                    alloc = local.allocate(ctype, len(todo), a.cpu_millis, a.memory_mib, job,
                                           runtime_estimate_ms=1000)
                    if not alloc.grants:
                        raise SystemExit(f"no {ctype} grant: {alloc.unplaced_reason}")
                    for g in alloc.grants:
                        task = todo.pop(0)
                        attempts[task] += 1
                        state = pool.start(g, a.command[0], a.command[1:], env={"TASK": str(task)})
                        print(f"task {task}: {ctype} container {g.container_id} on {g.node_id} "
                              f"({state})")
                        running[g.container_id] = (task, g)
            finals = pool.wait_final([g for _, g in running.values()], timeout=a.timeout)
            pending = []
            for cid, ev in finals.items():
                task, g = running[cid]
                if ev.kind == "completed":
                    results[task] = ev.exit_code
                    print(f"task {task}: completed, exit code {ev.exit_code}")
                elif ev.reason in ("shed", "preempted_by_guaranteed", "lost") \
                        and attempts[task] < MAX_ATTEMPTS:
                    print(f"task {task}: killed ({ev.reason}), asking again")
                    pending.append(task)
                else:
                    results[task] = None
                    print(f"task {task}: killed ({ev.reason}): {ev.detail.get('message')}")
                # Ended containers need no release; this shows the call for work given back early.
                try:
                    local.release(g)
                except hs.ServerError as e:
                    if e.code != "unknown_container":
                        raise
    failed = sorted(t for t, rc in results.items() if rc != 0)
    if failed:
        print(f"tasks failed: {failed}")
        return 1
    print(f"all {a.tasks} tasks done")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (hs.ClientError, ValueError) as e:
        print(f"job manager: {e}", file=sys.stderr)
        sys.exit(2)
