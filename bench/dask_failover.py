#!/usr/bin/env python3
"""Dask distributed losing a worker mid-task: the peer figures for the failover benchmark
(bench/failover_bench.cc runs it side by side). Each trial submits one task that processes
--records records at --record-ms each, logging like bench/paced_runner.cc; when it is half done the
worker process running it is SIGKILLed (its nanny starts a new one). Measured: from the kill to the
task starting on another worker, and records processed more than once. One JSON line per trial."""
import argparse
import json
import os
import signal
import time

from dask.distributed import Client, LocalCluster


def now_ms():
    return int(time.time() * 1000)


def append(path, line):
    with open(path, "a") as f:
        f.write(line)


def paced_task(trial, records, record_ms, log):
    """The paced runner's work in Dask: one log line at the start, one per record."""
    append(log, "%d start trial%d %d %d\n" % (now_ms(), trial, os.getpid(), os.getppid()))
    for i in range(records):
        time.sleep(record_ms / 1000.0)
        append(log, "%d record trial%d t%d-r%d\n" % (now_ms(), trial, trial, i))
    return records


def read_log(path, trial):
    """(start lines, record lines) of one trial: [(ms, pid)], [(ms, custom_id, pid of the runner)]."""
    starts, records, pid = [], [], None
    if not os.path.exists(path):
        return starts, records
    batch = "trial%d" % trial
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 4 or fields[2] != batch:
                continue
            if fields[1] == "start":
                pid = fields[3]
                starts.append((int(fields[0]), pid))
            elif fields[1] == "record":
                records.append((int(fields[0]), fields[3], pid))
    return starts, records


def wait_for(predicate, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    raise TimeoutError("gave up waiting")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--records", type=int, default=40)
    parser.add_argument("--record-ms", type=int, default=50)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    if os.path.exists(args.log):
        os.remove(args.log)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(args.workers)
        for trial in range(args.trials):
            future = client.submit(paced_task, trial, args.records, args.record_ms, args.log,
                                   key="trial-%d" % trial, pure=False)
            starts = wait_for(lambda: read_log(args.log, trial)[0])
            victim = starts[0][1]
            wait_for(lambda: len(read_log(args.log, trial)[1]) >= args.records // 2)
            killed = now_ms()
            os.kill(int(victim), signal.SIGKILL)
            again = wait_for(lambda: [s for s in read_log(args.log, trial)[0] if s[1] != victim])
            future.result(timeout=120)
            _, records = read_log(args.log, trial)
            ids = [r[1] for r in records]
            print(json.dumps({
                "trial": trial,
                "failover_s": (again[0][0] - killed) / 1000.0,
                "done_by_dead": sum(1 for r in records if r[2] == victim),
                "redone": len(ids) - len(set(ids)),
            }), flush=True)
            client.wait_for_workers(args.workers)  # the nanny has replaced the dead worker


if __name__ == "__main__":
    main()
