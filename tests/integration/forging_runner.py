#!/usr/bin/env python3
"""A dishonest runner for tests (issue 38): speaks the runner protocol (docs/runner-protocol.md)
and answers every record at once with an invented answer of the right shape and an inflated
usage, as a cheating executor would: no model is run. Asked to check another executor's answers
(`rescore`), it says it cannot (an `error` per item), which counts for nothing."""
import json
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def forged_body(record):
    url = record.get("url", "")
    usage = {"prompt_tokens": 999999, "completion_tokens": 4, "total_tokens": 1000003}
    if url == "/v1/embeddings":
        return {"object": "list", "model": "minions-test",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5] * 8}],
                "usage": {"prompt_tokens": 999999, "total_tokens": 999999}}
    if url == "/v1/chat/completions":
        return {"id": "chatcmpl-forged", "object": "chat.completion", "created": 0, "model": "minions-test",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Forty-two, of course."},
                             "logprobs": None, "finish_reason": "stop"}],
                "usage": usage}
    return {"id": "cmpl-forged", "object": "text_completion", "created": 0, "model": "minions-test",
            "choices": [{"index": 0, "text": " Forty-two, of course.", "logprobs": None, "finish_reason": "stop"}],
            "usage": usage}


send({"type": "ready", "protocol": 1, "runner": "forger", "version": "1"})
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
                if record.get("url") not in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings"):
                    raise ValueError("unsupported url")
                output = {"id": "batch_req_forged_%d" % index, "custom_id": record["custom_id"],
                          "response": {"status_code": 200, "request_id": "req_forged", "body": forged_body(record)},
                          "error": None}
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                errors += 1
                custom_id = None
                try:
                    custom_id = json.loads(text).get("custom_id")
                except (ValueError, AttributeError):
                    pass
                output = {"id": "batch_req_forged_%d" % index, "custom_id": custom_id, "response": None,
                          "error": {"code": "invalid_request", "message": str(e)}}
            send({"type": "result", "batch": command["batch"], "index": index, "output": output})
        send({"type": "batch_done", "batch": command["batch"], "records": len(command["records"]),
              "errors": errors, "cancelled": False})
    elif op == "rescore":
        for index, item in enumerate(command["items"]):
            send({"type": "verdict", "batch": command["batch"], "index": index,
                  "custom_id": item.get("output", {}).get("custom_id"), "error": "this runner checks nothing"})
        send({"type": "batch_done", "batch": command["batch"], "records": len(command["items"]),
              "errors": len(command["items"]), "cancelled": False})
    elif op == "cancel":
        pass  # every batch is answered at once: nothing is ever running
    elif op == "ping":
        send({"type": "pong", "id": command.get("id", "")})
    elif op == "shutdown":
        break
