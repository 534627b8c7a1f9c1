#!/usr/bin/env python3
"""A minimal Minions runner: answers every completion record with its own prompt.

Shows that any program speaking the runner protocol (docs/runner-protocol.md) can be a runner.
Try: build/apps/minions local-run in.jsonl --model none --runner examples/echo_runner.py -o out.jsonl
"""
import json
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


send({"type": "ready", "protocol": 1, "runner": "echo", "version": "1"})
for line in sys.stdin:
    command = json.loads(line)
    op = command.get("op")
    if op == "load":
        send({"type": "loaded", "model": command["model"], "info": {}})
    elif op == "run":
        errors = 0
        for index, text in enumerate(command["records"]):
            try:
                record = json.loads(text)
                body = {"object": "text_completion",
                        "choices": [{"index": 0, "text": record.get("prompt", ""), "finish_reason": "stop"}]}
                output = {"id": "echo-%d" % index, "custom_id": record["custom_id"],
                          "response": {"status_code": 200, "body": body}, "error": None}
            except (ValueError, KeyError, TypeError) as e:
                errors += 1
                output = {"id": "echo-%d" % index, "custom_id": None, "response": None,
                          "error": {"code": "invalid_request", "message": str(e)}}
            send({"type": "result", "batch": command["batch"], "index": index, "output": output})
        send({"type": "batch_done", "batch": command["batch"], "records": len(command["records"]),
              "errors": errors, "cancelled": False})
    elif op == "ping":
        send({"type": "pong", "id": command.get("id", "")})
    elif op == "shutdown":
        break
