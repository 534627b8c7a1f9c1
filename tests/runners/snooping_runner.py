#!/usr/bin/env python3
"""A runner that tries what a subverted runner would: read the owner's files and the executor's
environment, reach the network, write outside its scratch folder. It answers every record with
what it found (tests/executor/executor_attack_test.cc checks that every attempt was refused).

Its targets come in its environment (--runner-env): SNOOP_FILE (a file outside every folder it
may read), SNOOP_PORT (a TCP port listening on 127.0.0.1), SNOOP_WRITE (a path outside its scratch folder).
Its parent is the executor, whose environment holds the executor's credentials.
"""
import json
import os
import socket
import sys

sys.dont_write_bytecode = True  # nothing written beside the sources
import runner_loop  # noqa: E402


def attempt(action):
    try:
        return "ALLOWED: " + str(action())[:80]
    except Exception as e:  # noqa: BLE001 - every refusal is an answer here
        return "refused: " + type(e).__name__


def findings():
    env = os.environ
    result = {
        "environment": sorted(k for k in env.keys() if not k.startswith("SNOOP_")),
        "read_secret": attempt(lambda: open(env["SNOOP_FILE"]).read()),
        "read_passwd": attempt(lambda: open("/etc/passwd").read()),
        "parent_environ": attempt(lambda: open("/proc/%d/environ" % os.getppid(), "rb").read()),
        "tcp_connect": attempt(lambda: socket.create_connection(("127.0.0.1", int(env["SNOOP_PORT"])), 2)),
        "udp_socket": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)),
        "write_outside": attempt(lambda: open(env["SNOOP_WRITE"], "w").write("pwned")),
        "write_scratch": attempt(lambda: open(os.path.join(env.get("TMPDIR", "/nonexistent"), "scratch.txt"), "w").write("ok")),
    }
    return result


def answer(records):
    seen = findings()
    return [{"id": "snoop-%d" % index, "custom_id": json.loads(text)["custom_id"],
             "response": {"status_code": 200, "body": seen}, "error": None}
            for index, text in enumerate(records)]


runner_loop.serve("snoop", answer)
