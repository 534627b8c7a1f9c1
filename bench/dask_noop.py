#!/usr/bin/env python3
"""Dask distributed running N empty tasks on a local cluster: the peer figure for the control-plane
benchmark (bench/pool_bench.cc runs it side by side). Prints one JSON line."""
import argparse
import json
import time

from dask.distributed import Client, LocalCluster


def noop(i):
    return i


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=2000)
    args = parser.parse_args()
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.gather(client.map(noop, range(100), key=["warm-%d" % i for i in range(100)]))
        start = time.perf_counter()
        futures = client.map(noop, range(args.tasks), pure=False)
        client.gather(futures)
        seconds = time.perf_counter() - start
    print(json.dumps({"tasks": args.tasks, "seconds": seconds, "tasks_per_second": args.tasks / seconds}))


if __name__ == "__main__":
    main()
