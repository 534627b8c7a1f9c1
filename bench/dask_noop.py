#!/usr/bin/env python3
"""Dask distributed running N tasks on a local cluster: the peer figure for the control-plane
benchmark (bench/pool_bench.cc: empty tasks, 2 worker processes) and for the fleet simulator's
short-task workload (bench/peer-throughput: tasks that each sleep --task-ms, on as many worker
threads as Dask runs here). Time runs from client.map to every result gathered, after a warm-up
that has every worker up and connected. Prints one JSON line."""
import argparse
import json
import sys
import time

from dask.distributed import Client, LocalCluster


def noop(i):
    return i


def sleeper(seconds):
    def task(i):
        time.sleep(seconds)  # releases the GIL: a worker's threads sleep side by side
        return i
    return task


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--threads-per-worker", type=int, default=1, help="task threads in each worker process")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--task-ms", type=float, default=0, help="each task sleeps this long (0: returns at once)")
    args = parser.parse_args()
    body = sleeper(args.task_ms / 1000) if args.task_ms > 0 else noop
    started = time.perf_counter()
    with LocalCluster(n_workers=args.workers, threads_per_worker=args.threads_per_worker, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(args.workers, timeout=600)
        cluster_seconds = time.perf_counter() - started
        print("dask: %d workers x %d threads up in %.1f s" % (args.workers, args.threads_per_worker, cluster_seconds),
              file=sys.stderr, flush=True)
        client.gather(client.map(noop, range(100), key=["warm-%d" % i for i in range(100)]))
        print("dask: warm", file=sys.stderr, flush=True)
        start = time.perf_counter()
        futures = client.map(body, range(args.tasks), pure=False)
        client.gather(futures)
        seconds = time.perf_counter() - start
    print(json.dumps({"tasks": args.tasks, "task_ms": args.task_ms, "workers": args.workers,
                      "threads_per_worker": args.threads_per_worker,
                      "slots": args.workers * args.threads_per_worker, "cluster_start_seconds": cluster_seconds,
                      "seconds": seconds, "tasks_per_second": args.tasks / seconds}))


if __name__ == "__main__":
    main()
