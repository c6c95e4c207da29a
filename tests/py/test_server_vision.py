"""Images in `pshard serve`'s chat completions (image_url parts with base64 data: URLs), through
the official OpenAI Python client, on gguf-synth's tiny Qwen2.5-VL pair: a reply equals `pshard run
--mmproj --image` on the same prompt, two requests with different images at once each equal their
runs alone, a repeated image reuses its cells while another image of the same size reuses none of
its own, every bad image is answered with OpenAI's error object naming the part, never a crash, and
/props says images are read (without --mmproj, that they are not) and how large a body may be."""
import base64
import os
import threading

import numpy as np
import openai
import pytest

from conftest import run_pshard
from server_helpers import Server
from vision_helpers import random_image, write_tiny_vlm

Image = pytest.importorskip("PIL.Image")
N = 12


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vlm")
    rng = write_tiny_vlm(d)  # a.png: 7 x 11 image tokens, b.png: 4 x 3
    (d / "c.png").write_bytes(random_image(rng, 196, 308))  # a's size, other pixels
    (d / "d.jpg").write_bytes(random_image(rng, 100, 150, "JPEG"))
    return d


@pytest.fixture(scope="module")
def server(files, tmp_path_factory):
    s = Server(str(files / "tiny-qwen25vl.gguf"), "--mmproj", str(files / "tiny-qwen25vl-mmproj.gguf"),
               "--parallel", "2", "-c", "1024", log_dir=tmp_path_factory.mktemp("serve"))
    yield s
    assert s.stop() == 0, s.log_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def data_url(path, kind="png"):
    return f"data:image/{kind};base64," + base64.b64encode(open(path, "rb").read()).decode()


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


def ask(client, parts, **kw):
    kw = {"max_tokens": N, "temperature": 0, "extra_body": {"ignore_eos": True}, **kw}
    return client.chat.completions.create(model="any", messages=[{"role": "user", "content": parts}], **kw)


def run_text(files, prompt, images):
    """What `pshard run` says (chat-formatted, greedy, N tokens) for images put before the prompt."""
    args = ["run", "-m", str(files / "tiny-qwen25vl.gguf"), "--mmproj", str(files / "tiny-qwen25vl-mmproj.gguf"),
            "--temp", "0", "-n", str(N), "--ignore-eos", "-q", "-t", "2", "-p", prompt]
    for im in images:
        args += ["--image", str(files / im)]
    out = run_pshard(*args).stdout
    return out[:-1] if out.endswith("\n") else out


@pytest.mark.parametrize("images", [["a.png"], ["a.png", "b.png"], ["d.jpg"]])
def test_reply_equals_run(files, client, images):
    parts = [image_part(data_url(files / im, "jpeg" if im.endswith(".jpg") else "png")) for im in images]
    r = ask(client, parts + [{"type": "text", "text": "Describe: "}])
    assert r.usage.completion_tokens == N and r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content == run_text(files, "Describe: ", images)


def test_images_matter(files, client):
    text = {"type": "text", "text": "Describe: "}
    one = ask(client, [image_part(data_url(files / "a.png")), text]).choices[0].message.content
    other = ask(client, [image_part(data_url(files / "c.png")), text]).choices[0].message.content
    assert one != other


LONG = 120  # replies long enough that requests sent at once run side by side


def replies_at_once(client, asks, meanwhile=lambda: None):
    """Each ask's greedy reply, all sent at once (each from its own thread); meanwhile runs while they do."""
    together, errors = {}, []

    def go(name):
        try:
            together[name] = ask(client, asks[name], max_tokens=LONG).choices[0].message.content
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=go, args=(name,)) for name in asks]
    for t in threads:
        t.start()
    meanwhile()
    for t in threads:
        t.join()
    assert not errors, errors
    return together


def test_concurrent_requests_equal_their_solo_runs(files, client):
    asks = {im: [{"type": "text", "text": "What is in "}, image_part(data_url(files / im)), {"type": "text", "text": "?"}]
            for im in ("a.png", "b.png")}
    alone = {im: ask(client, parts, max_tokens=LONG).choices[0].message.content for im, parts in asks.items()}
    for _ in range(2):
        assert replies_at_once(client, asks) == alone


def test_images_decoded_before_queueing_beside_text(files, client):
    """Images are decoded on the request's own thread before it is queued (the engine thread only
    encodes them): an image request and a text request at once each give their greedy reply alone,
    and a bad image sent meanwhile is refused with a 400 naming its part while they run."""
    asks = {"text": "Count slowly: ", "image": [image_part(data_url(files / "c.png")), {"type": "text", "text": "Say: "}]}
    alone = {name: ask(client, parts, max_tokens=LONG).choices[0].message.content for name, parts in asks.items()}
    junk = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 40).decode()

    def bad_image():
        with pytest.raises(openai.BadRequestError) as e:
            ask(client, [{"type": "text", "text": "See "}, image_part(junk)])
        err = error_of(e)
        assert err["param"] == "messages[0].content[1]" and "image 1: " in err["message"], err
    assert replies_at_once(client, asks, bad_image) == alone


def test_prepared_images_uncounted_when_done(files, client, server):
    """The images' patches waiting to be encoded (/metrics, pshard_images_prepared_bytes) count back
    to 0 once requests with images end: answered, refused for a bad image, or cut off mid-stream."""
    def prepared():
        text = server.request("GET", "/metrics")[2]
        line = [l for l in text.splitlines() if l.startswith("pshard_images_prepared_bytes ")]
        assert line, text
        return float(line[0].split()[1])
    assert prepared() == 0
    ask(client, [image_part(data_url(files / "a.png")), image_part(data_url(files / "b.png")), {"type": "text", "text": "Hi"}])
    junk = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 40).decode()
    with pytest.raises(openai.BadRequestError):
        ask(client, [image_part(data_url(files / "c.png")), image_part(junk)])
    stream = ask(client, [image_part(data_url(files / "d.jpg", "jpeg")), {"type": "text", "text": "Go"}], max_tokens=LONG,
                 stream=True)
    next(iter(stream))
    stream.close()  # the client goes away mid-stream
    assert prepared() == 0


def test_stream_equals_whole_reply(files, client):
    parts = [image_part(data_url(files / "b.png")), {"type": "text", "text": "Say: "}]
    whole = ask(client, parts).choices[0].message.content
    stream = ask(client, parts, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole


def test_prefix_reuse_never_mixes_images(files, client):
    """The same conversation again reuses the cells of its image; another image of the same size at
    the same place reuses only the cells before it, and gives what it gives alone."""
    def parts(im):
        return [{"type": "text", "text": "Image: "}, image_part(data_url(files / im)), {"type": "text", "text": " Tell."}]
    first = ask(client, parts("a.png"))
    again = ask(client, parts("a.png"))
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 77  # past the image's 77 tokens
    other = ask(client, parts("c.png"))
    assert other.usage.prompt_tokens_details.cached_tokens < 20  # stops where the image starts
    assert other.usage.prompt_tokens == first.usage.prompt_tokens
    assert other.choices[0].message.content == run_text(files, "Image: <__image__> Tell.", ["c.png"])


def error_of(exc_info):
    body = exc_info.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_bad_images_named(files, client, server, tmp_path):
    good = data_url(files / "b.png")
    junk = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 40).decode()
    Image.new("RGB", (16385, 1)).save(tmp_path / "wide.png")
    cases = [
        ("https://example.com/cat.png", "messages[0].content[1].image_url", "fetches nothing"),
        ("data:image/png;base64,UE5H!Q==", "messages[0].content[1].image_url", "base64"),
        ("data:image/webp;base64,UE5HIQ==", "messages[0].content[1].image_url", "JPEG and PNG"),
        (junk, "messages[0].content[1]", "image 1: "),
        (data_url(tmp_path / "wide.png"), "messages[0].content[1]", "16384"),
        ("data:image/png;base64," + base64.b64encode(b"GIF89a" + b"\0" * 20).decode(), "messages[0].content[1]",
         "not a JPEG or PNG"),
    ]
    for url, param, says in cases:
        with pytest.raises(openai.BadRequestError) as e:
            ask(client, [{"type": "text", "text": "See "}, image_part(url)])
        err = error_of(e)
        assert err["param"] == param and says in err["message"] and err["type"] == "invalid_request_error", err
    # the second image is the bad one: named as such, and the first does not matter
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, [image_part(good), {"type": "text", "text": "and"}, image_part(junk)])
    err = error_of(e)
    assert err["param"] == "messages[0].content[2]" and "image 2: " in err["message"], err
    # markers and images that disagree
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, [image_part(good), {"type": "text", "text": "and <__image__>"}])
    assert "image marker" in error_of(e)["message"]
    # an image whose tokens (36 x 36) do not fit a sequence's context (1024 cells shared by 2 sequences)
    big = random_image(np.random.default_rng(5), 1000, 1000)
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, [image_part("data:image/png;base64," + base64.b64encode(big).decode())])
    err = error_of(e)
    assert err["code"] == "context_length_exceeded" and "raise -c" in err["message"], err
    # a body over the old 4 MiB default is read (a vision server takes 32 MiB): the image is judged
    status, _, body = server.request("POST", "/v1/chat/completions", body={"messages": [{"role": "user", "content": [
        image_part("data:image/png;base64," + base64.b64encode(b"\x89PNG" + os.urandom(5 << 20)).decode())]}]})
    assert status == 400 and "image 1: " in body["error"]["message"], body
    # the server still answers
    assert ask(client, [image_part(good), {"type": "text", "text": "ok"}]).usage.completion_tokens == N


def test_props_says_images_are_read(server):
    """What the chat page reads to offer images, and to refuse one larger than a request may be."""
    status, _, props = server.request("GET", "/props")
    assert status == 200 and props["modalities"] == {"vision": True} and props["max_body_bytes"] == 32 << 20, props
    assert props["arch"] == "qwen2vl" and props["n_parallel"] == 2  # the other fields as before


def test_without_mmproj_images_are_refused(files, tmp_path):
    s = Server(str(files / "tiny-qwen25vl.gguf"), log_dir=tmp_path)
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError) as e:
            ask(c, [image_part(data_url(files / "b.png")), {"type": "text", "text": "x"}])
        err = error_of(e)
        assert err["param"] == "messages[0].content[0]" and "--mmproj" in err["message"], err
        assert ask(c, "Describe: ").usage.completion_tokens == N  # text still served
        assert s.request("GET", "/props")[2]["modalities"] == {"vision": False}
    finally:
        assert s.stop() == 0, s.log_text()
