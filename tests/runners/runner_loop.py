"""The runner protocol's loop (docs/runner-protocol.md) for the test runners in this folder.

A test runner only says how it answers a batch of records; this module speaks the rest: `ready`,
`load`, `run` (one `result` per record, then `batch_done`), `rescore` (answered as uncheckable: a
test runner checks nothing, which counts for nothing), `cancel` (every batch is answered at once,
so nothing is ever running), `ping` and `shutdown`. It sits beside the runners because a
sandboxed runner reads only its own folder.
"""
import json
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def error_line(line_id, text, message):
    """The error line for a record the runner does not answer; its custom_id when it has one."""
    custom_id = None
    try:
        custom_id = json.loads(text).get("custom_id")
    except (ValueError, AttributeError):
        pass
    return {"id": line_id, "custom_id": custom_id, "response": None,
            "error": {"code": "invalid_request", "message": message}}


def serve(name, answer_batch):
    """Serves commands from stdin until shutdown or its end. `answer_batch(records)` gets a `run`
    command's record lines and returns one output line (a dict) per record, in order."""
    send({"type": "ready", "protocol": 1, "runner": name, "version": "1"})
    for line in sys.stdin:
        command = json.loads(line)
        op = command.get("op")
        if op == "load":
            send({"type": "loaded", "model": command["model"], "info": {}})
        elif op == "run":
            outputs = answer_batch(command["records"])
            for index, output in enumerate(outputs):
                send({"type": "result", "batch": command["batch"], "index": index, "output": output})
            send({"type": "batch_done", "batch": command["batch"], "records": len(outputs),
                  "errors": sum(1 for o in outputs if o.get("error") is not None), "cancelled": False})
        elif op == "rescore":
            for index, item in enumerate(command["items"]):
                send({"type": "verdict", "batch": command["batch"], "index": index,
                      "custom_id": item.get("output", {}).get("custom_id"), "error": "this runner checks nothing"})
            send({"type": "batch_done", "batch": command["batch"], "records": len(command["items"]),
                  "errors": len(command["items"]), "cancelled": False})
        elif op == "ping":
            send({"type": "pong", "id": command.get("id", "")})
        elif op == "shutdown":
            break
