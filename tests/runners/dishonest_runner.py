#!/usr/bin/env python3
"""A dishonest or broken runner for tests (issue 38). It speaks the runner protocol, runs no model
and answers every record at once, so it takes as much of a job as it can get. What it claims
depends on DISHONEST_MODE in its environment (--runner-env):

  forge     (the default) an invented answer of the right shape, "Forty-two, of course.", and
            999,999 prompt tokens, as the cheating executor tried live did
  invent    the honest answer's words replaced by other answers' words (as many), usage kept:
            plausible text in the model's own words, and only re-scoring can tell
  swap      another record's honest answer (the next one in the file whose text differs)
  truncate  the honest text cut in half, finish "stop", completion_tokens halved
  flip      the honest answer with each claimed token flipped with probability
            DISHONEST_FLIP_RATE (0.001, a failing core), drawn from a generator seeded by
            DISHONEST_SEED (counted over every token this runner answers, so the flips land at
            fixed places in its stream); a flip replaces one character at the token's place
  inflate   the honest answer with 999,999 prompt tokens

Every mode but forge starts from an honest run's output (DISHONEST_ANSWERS: a JSON-lines file of
its output and error lines, found by custom_id; it must lie in a folder the runner may read). A
record it has no honest line for gets an error line. Each record it corrupts is named on stderr
(the runner's log). Asked to check others' answers (`rescore`), it says it cannot.
"""
import json
import os
import random
import sys

sys.dont_write_bytecode = True  # nothing written beside the sources
import runner_loop  # noqa: E402

MODE = os.environ.get("DISHONEST_MODE", "forge")
MODES = ("forge", "invent", "swap", "truncate", "flip", "inflate")
if MODE not in MODES:
    sys.exit("dishonest_runner: DISHONEST_MODE must be one of %s, not %r" % (", ".join(MODES), MODE))
FLIP_RATE = float(os.environ.get("DISHONEST_FLIP_RATE", "0.001"))
RANDOM = random.Random(int(os.environ.get("DISHONEST_SEED", "1")))


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


def load_honest():
    """custom_id -> the honest output line, and the custom_ids in the file's order."""
    if MODE == "forge":
        return {}, []
    honest, order = {}, []
    with open(os.environ["DISHONEST_ANSWERS"]) as f:
        for line in f:
            if line.strip():
                output = json.loads(line)
                if output.get("custom_id") is not None:
                    honest[output["custom_id"]] = output
                    order.append(output["custom_id"])
    return honest, order


HONEST, ORDER = load_honest()


def text_of(output):
    """The answer's text and a function that sets it, or None for a line that is not a text answer."""
    try:
        choice = output["response"]["body"]["choices"][0]
    except (KeyError, IndexError, TypeError):
        return None
    holder, key = (choice["message"], "content") if "message" in choice else (choice, "text")
    if not isinstance(holder.get(key), str):
        return None
    return holder[key], lambda text: holder.__setitem__(key, text)


def usage_of(output):
    return output["response"]["body"]["usage"]


def words_of_others(custom_id):
    words = []
    for other in ORDER:
        found = text_of(HONEST[other]) if other != custom_id else None
        if found:
            words.extend(found[0].split())
    return words or ["words"]


def corrupt(output):
    """Corrupts an honest text answer in place by MODE; returns what it did, or "" for nothing."""
    found = text_of(output)
    if found is None:
        return ""
    text, set_text = found
    custom_id = output["custom_id"]
    if MODE == "invent":
        pool, n = words_of_others(custom_id), max(1, len(text.split()))
        invented = text
        while invented == text:
            invented = " " + " ".join(RANDOM.choice(pool) for _ in range(n))
        set_text(invented)
        return "invented"
    if MODE == "swap":
        start = ORDER.index(custom_id)
        for other in ORDER[start + 1:] + ORDER[:start]:
            other_found = text_of(HONEST[other])
            if other_found and other_found[0] != text:
                output["response"] = json.loads(json.dumps(HONEST[other]["response"]))
                return "swapped with " + other
        return ""
    if MODE == "truncate":
        set_text(text[:len(text) // 2])
        output["response"]["body"]["choices"][0]["finish_reason"] = "stop"
        usage = usage_of(output)
        usage["completion_tokens"] = (usage["completion_tokens"] + 1) // 2
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return "truncated"
    if MODE == "flip":
        n = usage_of(output).get("completion_tokens", 0)
        flipped = []
        for token in range(n):
            if RANDOM.random() < FLIP_RATE:
                place = token * len(text) // n
                replaced = text[place] if place < len(text) else ""
                text = text[:place] + ("#" if replaced != "#" else "%") + text[place + 1:]
                flipped.append(str(token))
        if flipped:
            set_text(text)
        return "flipped token " + ", ".join(flipped) if flipped else ""
    if MODE == "inflate":
        usage = usage_of(output)
        usage["prompt_tokens"] = 999999
        usage["total_tokens"] = 999999 + usage["completion_tokens"]
        return "inflated"
    return ""


def answer(index, text):
    try:
        record = json.loads(text)
        if MODE != "forge":
            if record["custom_id"] not in HONEST:
                raise ValueError("no honest answer to start from")
            output = json.loads(json.dumps(HONEST[record["custom_id"]]))
            done = corrupt(output)
            if done:
                sys.stderr.write("dishonest_runner (%s): %s: %s\n" % (MODE, record["custom_id"], done))
            return output
        if record.get("url") not in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings"):
            raise ValueError("unsupported url")
        return {"id": "batch_req_forged_%d" % index, "custom_id": record["custom_id"],
                "response": {"status_code": 200, "request_id": "req_forged", "body": forged_body(record)},
                "error": None}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return runner_loop.error_line("batch_req_forged_%d" % index, text, str(e))


runner_loop.serve("forger" if MODE == "forge" else "dishonest-" + MODE,
                  lambda records: [answer(index, text) for index, text in enumerate(records)])
