"""`pshard serve` under load, on the default model: 64 clients streaming at once (8 sequences, the
rest queued), a third of them disconnecting at random points. Every stream that completes equals
the same request run alone (greedy); the disconnected ones are cancelled and free their sequences;
the server stays up, and its memory stays level over 1,000 short requests (one prompt, its
cells reused, and one token each: the CPU of a CI machine, not the server, bounds how many it can
answer a second)."""
import concurrent.futures
import json
import random
import threading
import time
import urllib.request

import openai
import pytest

from server_helpers import Server

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Count from one to ten.",
           "Name three fruits.", "Why is the sky blue?", "What is 12 times 12?", "Describe a cat in one sentence.",
           "Give me a word that rhymes with moon."]
N_CLIENTS = 64
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory):
    s = Server(default_model, "--parallel", "8", "-c", "4096", "--max-queue", "64",
               log_dir=tmp_path_factory.mktemp("serve-load"))
    yield s
    assert s.stop() == 0, s.log_text()


def metrics(server):
    text = server.request("GET", "/metrics")[2]
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}


def test_concurrent_streams_equal_alone(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    ask = dict(model="any", max_tokens=MAX_TOKENS, temperature=0)
    alone = [client.chat.completions.create(messages=[{"role": "user", "content": p}], **ask).choices[0].message.content
             for p in PROMPTS]
    rng = random.Random(5)
    leave_after = [rng.randrange(0, 12) if i % 3 == 0 else None for i in range(N_CLIENTS)]
    start = threading.Barrier(N_CLIENTS)

    def one(i):
        start.wait(timeout=60)
        stream = client.chat.completions.create(messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                                stream=True, **ask)
        text, finish = "", None
        for n, chunk in enumerate(stream):
            if leave_after[i] is not None and n >= leave_after[i]:
                stream.close()  # the client goes away mid-stream
                return None
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(N_CLIENTS) as pool:
        results = list(pool.map(one, range(N_CLIENTS), timeout=240))
    elapsed = time.monotonic() - t0
    completed = 0
    for i, r in enumerate(results):
        if r is None:
            continue
        completed += 1
        assert r[0] == alone[i % len(PROMPTS)], "client %d" % i
        assert r[1] in ("stop", "length")
    assert completed >= sum(1 for x in leave_after if x is None) and completed < N_CLIENTS  # short replies may end first
    # The cancelled requests are gone from the engine: nothing left in flight.
    deadline = time.monotonic() + 30
    while metrics(server)["pshard_requests_in_flight"] > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    m = metrics(server)
    assert m["pshard_requests_in_flight"] == 0 and m["pshard_active_sequences"] == 0
    assert m['pshard_requests_total{result="cancelled"}'] > 0
    assert server.request("GET", "/health")[0] == 200
    print("64 streams (%d completed) in %.1f s" % (completed, elapsed))


def short_request(server, i):
    body = json.dumps({"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 1, "seed": i,
                       "temperature": 0}).encode()
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] <= 1


def test_memory_level_over_many_requests(server):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: short_request(server, i), range(100), timeout=240))
        before = server.rss_kb()
        t0 = time.monotonic()
        list(pool.map(lambda i: short_request(server, i), range(1000), timeout=240))
        elapsed = time.monotonic() - t0
    after = server.rss_kb()
    print("1000 requests in %.1f s; RSS %d -> %d KB" % (elapsed, before, after))
    assert after - before < 16 * 1024, "RSS grew from %d to %d KB over 1000 requests" % (before, after)
