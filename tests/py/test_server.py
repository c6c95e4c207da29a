"""`pshard serve` through the official OpenAI Python client, on the default model: chat and text
completions, whole and streamed (the stream's text equals the whole reply's), usage, stop strings,
log-probabilities, seeds (the same seed gives the same text), the API key, and every bad request
answered with OpenAI's error object naming the field, never a crash."""
import json
import signal
import socket
import threading
import time
import urllib.request

import openai
import pytest

from conftest import run_pshard
from server_helpers import Server

MODEL_ARGS = ["--parallel", "4", "-c", "4096"]


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory):
    s = Server(default_model, *MODEL_ARGS, log_dir=tmp_path_factory.mktemp("serve"))
    yield s
    assert s.stop() == 0, s.log_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, content, **kw):
    return client.chat.completions.create(model="any", messages=[{"role": "user", "content": content}], **kw)


def test_chat(client):
    r = chat(client, "What is the capital of France?", max_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant" and "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 5 and 0 < u.completion_tokens <= 24 and u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_max_tokens_gives_length(client):
    r = chat(client, "Write a long story about a dragon.", max_completion_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    r = chat(client, "Say yes.", max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 40


def test_completions(client):
    r = client.completions.create(model="any", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and "Paris" in r.choices[0].text
    assert r.usage.completion_tokens <= 8


def test_stream_equals_whole_reply(client):
    whole = chat(client, "Name three colors.", max_tokens=32, temperature=0)
    chunks = list(chat(client, "Name three colors.", max_tokens=32, temperature=0, stream=True,
                       stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_stream(client):
    whole = client.completions.create(model="any", prompt="1, 2, 3,", max_tokens=12, temperature=0)
    stream = client.completions.create(model="any", prompt="1, 2, 3,", max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == whole.choices[0].text


def test_stop_strings(client):
    free = client.completions.create(model="any", prompt="1, 2, 3, 4,", max_tokens=16, temperature=0).choices[0]
    assert " 6," in free.text
    for stop in (" 6", [" 7", " 6,"]):
        r = client.completions.create(model="any", prompt="1, 2, 3, 4,", max_tokens=16, temperature=0, stop=stop)
        assert r.choices[0].text == free.text[:free.text.index(" 6")] and r.choices[0].finish_reason == "stop"
    stream = chat(client, "Count from one to ten in words.", max_tokens=48, temperature=0, stop=["five"], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "five" not in text


def test_same_seed_same_text(client):
    kw = dict(max_tokens=24, temperature=1.0, top_p=1.0)
    a = chat(client, "Tell me about cats.", seed=1234, **kw).choices[0].message.content
    b = chat(client, "Tell me about cats.", seed=1234, **kw).choices[0].message.content
    assert a == b
    others = {chat(client, "Tell me about cats.", seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1


def test_penalties_and_sampling_fields(client):
    r = chat(client, "Say hello.", max_tokens=8, temperature=0.5, top_p=0.9, presence_penalty=0.5,
             frequency_penalty=0.5, seed=7, extra_body={"top_k": 20, "min_p": 0.1, "an_unknown_field": [1, {"x": 2}]})
    assert r.choices[0].message.content


def test_logprobs(client):
    r = chat(client, "What is 2+2?", max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3 and bytes(t.bytes).decode("utf-8", "replace")
        lps = [x.logprob for x in t.top_logprobs]
        assert lps == sorted(lps, reverse=True) and abs(lps[0] - t.logprob) < 1e-4  # greedy: the most likely
    c = client.completions.create(model="any", prompt="The sky is", max_tokens=4, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == c.usage.completion_tokens
    assert "".join(lp.tokens) == c.choices[0].text


def test_models_health_props_metrics(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1"]
    assert client.models.retrieve("SmolLM2-135M-Instruct.Q4_1").id == "SmolLM2-135M-Instruct.Q4_1"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-5")
    assert error_of(e)["code"] == "model_not_found"
    assert server.request("GET", "/health")[::2] == (200, {"status": "ok"})
    status, _, props = server.request("GET", "/props")
    assert status == 200 and props["n_parallel"] == 4 and props["plan"] and props["vram"]["budget_bytes"] == 0
    assert props["modalities"] == {"vision": False} and props["max_body_bytes"] == 4 << 20  # the chat page's
    status, headers, text = server.request("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    values = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}
    assert values["pshard_tokens_generated_total"] > 0 and values["pshard_prompt_tokens_total"] > 0
    assert values["pshard_parallel_sequences"] == 4 and "pshard_queue_length" in values
    assert any(k.startswith("pshard_plan_info{") for k in values)
    status, headers, page = server.request("GET", "/")
    assert status == 200 and "text/html" in headers["Content-Type"] and "/v1/chat/completions" in page


def error_of(exc_info):
    body = exc_info.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("kw, param", [
    (dict(n=2), "n"), (dict(temperature="hot"), "temperature"), (dict(temperature=3), "temperature"),
    (dict(max_tokens=0), "max_tokens"), (dict(stop=[1, 2]), "stop"), (dict(stop=["x"] * 17), "stop"),
    (dict(top_logprobs=3), "top_logprobs"), (dict(logprobs="yes"), "logprobs"), (dict(seed=1.5), "seed"),
    (dict(stream="yes"), "stream"), (dict(extra_body={"stream_options": 3}), "stream_options"),
])
def test_bad_fields_named(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "hi", **kw)
    err = error_of(e)
    assert err["param"] == param and err["type"] == "invalid_request_error", err


@pytest.mark.parametrize("messages, param", [
    ("hello", "messages"), ([], "messages"), ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"), ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0].image_url"),
    ([{"role": "user", "content": [{"type": "input_audio"}]}], "messages[0].content[0]"),
])
def test_bad_messages_named(client, messages, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="any", messages=messages)
    assert error_of(e)["param"] == param


def test_content_parts_and_developer_role(client):
    r = client.chat.completions.create(model="any", max_tokens=4, temperature=0, messages=[
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]}])
    assert r.choices[0].message.content


def test_shared_system_prompt_is_reused(client):
    system = "You are a helpful assistant who answers questions about geography. " * 8
    ask = lambda q: client.chat.completions.create(model="any", max_tokens=2, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": q}])
    ask("What is the capital of Spain?")
    second = ask("Where is Mount Everest?")
    assert second.usage.prompt_tokens_details.cached_tokens > 80  # the system prompt's cells


def test_prompt_longer_than_context(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="any", prompt="word " * 5000, max_tokens=4)
    err = error_of(e)
    assert err["code"] == "context_length_exceeded" and "tokens" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:  # refused before it is tokenized
        chat(client, "x" * (4096 * 128 + 1))
    err = error_of(e)
    assert err["code"] == "context_length_exceeded" and "bytes" in err["message"] and err["param"] == "messages"


def test_raw_bodies(server):
    status, _, body = server.request("POST", "/v1/chat/completions", raw=b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, _, body = server.request("POST", "/v1/chat/completions", raw=b"[" * 100000 + b"]" * 100000)
    assert status == 400 and "deeper" in body["error"]["message"]
    # A body over the cap is refused from its declared length, before it is sent.
    host, port = server.url[len("http://"):].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (5 << 20))
        reply = sock.recv(65536).decode()
    assert reply.startswith("HTTP/1.1 413") and "request_too_large" in reply
    status, _, body = server.request("POST", "/v1/completions", raw=json.dumps({"prompt": "\ud800x"}).encode())
    assert status in (200, 400)
    assert server.request("GET", "/v1/nothing")[0] == 404
    assert server.request("GET", "/v1/chat/completions")[0] == 405
    assert server.request("GET", "/health")[0] == 200  # still serving


def test_api_key(default_model, tmp_path):
    s = Server(default_model, "-c", "1024", "--api-key", "sesame", log_dir=tmp_path)
    try:
        for key in ("wrong", "sesame-and-more", "sesam"):
            bad = openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0)
            with pytest.raises(openai.AuthenticationError) as e:
                bad.models.list()
            assert error_of(e)["type"] == "authentication_error"
        assert s.request("POST", "/v1/chat/completions", {"messages": []})[0] == 401
        assert s.request("GET", "/metrics")[0] == 401
        assert s.request("GET", "/health")[0] == 200 and s.request("GET", "/")[0] == 200
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sesame", max_retries=0)
        assert chat(good, "hi", max_tokens=2).choices[0].message.content is not None
    finally:
        assert s.stop() == 0


def test_sigint_finishes_streams_and_exits(default_model, tmp_path):
    s = Server(default_model, "-c", "1024", "--drain", "30", log_dir=tmp_path)
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
    stream = chat(client, "Count to twenty.", max_tokens=40, temperature=0, stream=True)
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    stopper = threading.Timer(0.2, s.proc.send_signal, (signal.SIGINT,))
    stopper.start()
    chunks = list(stream)  # the running request is let finish
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert s.stop(timeout=30) == 0 and "stopped" in s.log_text()


def test_full_queue_is_503_with_retry_after(default_model, tmp_path):
    s = Server(default_model, "-c", "2048", "--parallel", "1", "--max-queue", "1", "--drain", "0", log_dir=tmp_path)
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        running = chat(client, "Write a long story.", max_tokens=1000, stream=True, extra_body={"ignore_eos": True})
        next(iter(running))  # generating, until cancelled below: the one sequence is taken
        got = []
        waiting = threading.Thread(target=lambda: got.append(chat(client, "Hi", max_tokens=2)), daemon=True)
        waiting.start()  # queued behind it
        deadline = time.monotonic() + 30
        while "pshard_requests_in_flight 2" not in s.request("GET", "/metrics")[2] and time.monotonic() < deadline:
            time.sleep(0.02)
        status, headers, body = s.request("POST", "/v1/chat/completions",
                                          {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert status == 503 and headers["Retry-After"] == "1" and body["error"]["code"] == "queue_full", body
        running.close()  # cancelled: the waiting one takes the sequence
        waiting.join(timeout=60)
        assert got and got[0].choices[0].message.content is not None
    finally:
        assert s.stop() == 0


def test_client_leaving_cancels(server):
    """A client that closes its connection, waiting for a whole reply or mid-stream, has its
    request cancelled: nothing stays in flight. (The reply cannot end by itself first: it runs to
    max_tokens whatever the model samples.)"""
    host, port = server.url[len("http://"):].rsplit(":", 1)

    def in_flight():
        text = server.request("GET", "/metrics")[2]
        return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}

    def settle(until):
        deadline = time.monotonic() + 20
        while not until(in_flight()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return in_flight()

    cancelled = 'pshard_requests_total{result="cancelled"}'
    before = in_flight()[cancelled]
    for n, stream in enumerate((False, True), 1):
        body = json.dumps({"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 900,
                           "ignore_eos": True, "stream": stream}).encode()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            # The client leaves only once the server holds its request (and, streaming, has begun the reply).
            assert settle(lambda m: m["pshard_requests_in_flight"] > 0)["pshard_requests_in_flight"] == 1
            if stream:
                assert sock.recv(1)
        m = settle(lambda m: m["pshard_requests_in_flight"] == 0 and m[cancelled] == before + n)
        assert m["pshard_requests_in_flight"] == 0 and m[cancelled] == before + n, (
            {k: v for k, v in m.items() if k.startswith("pshard_requests")}, server.log_text()[-2000:])


@pytest.mark.parametrize("args, needle", [
    (["--port", "abc"], "--port"), (["--port", "70000"], "--port"), (["--parallel", "0"], "--parallel"),
    (["--max-body", "12"], "--max-body"), (["--api-key"], "--api-key"), (["--bogus"], "--bogus"),
])
def test_bad_options_refused(default_model, args, needle):
    proc = run_pshard("serve", "-m", default_model, *args, check=False)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_requests_without_max_tokens_run_together(server, client):
    """Without max_tokens a request may run to its sequence's share of the KV cells, not the whole
    pool: the engine admits a request only when the pool can hold it to its limit, so four of them
    run at once on four sequences."""
    streams = [chat(client, "Write a very long story number %d." % i, stream=True, extra_body={"ignore_eos": True})
               for i in range(4)]
    deadline, active = time.monotonic() + 20, []
    while active != ["pshard_active_sequences 4"] and time.monotonic() < deadline:
        text = server.request("GET", "/metrics")[2]
        active = [l for l in text.splitlines() if l.startswith("pshard_active_sequences ")]
        time.sleep(0.05)
    for s in streams:
        s.close()
    assert active == ["pshard_active_sequences 4"], active
