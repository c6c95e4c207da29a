"""The chat page of `pshard serve` in headless Chromium (Debian's chromium), driven through the
Chrome DevTools protocol over a pipe (--remote-debugging-pipe: no extra Python package): the page
shows the model and plan, a typed question gets a streamed answer with its TTFT and speed, a second
question continues the conversation, and a text-only server offers no images. On the tiny
Qwen2.5-VL pair with --mmproj: an image picked through the file input and one pasted go with their
questions, show as thumbnails, and each answer equals the API's for the conversation the page
sent; what the page refuses itself (not an image, over --max-body) and what the server refuses (an
image too large for the context) say so. Screenshots are kept under the build directory
(test-artifacts/chat_page.png, chat_page_vision.png). Skipped where no Chromium is installed."""
import base64
import io
import json
import os
import shutil
import subprocess
import tempfile
import time

import openai
import pytest

from conftest import BUILD
from server_helpers import Server
from vision_helpers import random_image, write_tiny_vlm

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Browser:
    """Chromium with the DevTools protocol on fds 3 (commands in) and 4 (replies out), messages
    separated by NUL bytes."""

    def __init__(self, profile_dir):
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()

        def to_fds_3_and_4():
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        # Its temporary folder (the singleton socket's), removed at close: killed, it would leave it
        # in /tmp. Short, as a socket's path must be.
        self.scratch = tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--remote-debugging-pipe", "--user-data-dir=" + str(profile_dir), "--window-size=1000,760", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(3, 4), preexec_fn=to_fds_3_and_4,
            env={**os.environ, "TMPDIR": self.scratch})
        os.close(cmd_r)
        os.close(out_w)
        self.buffer, self.next_id, self.session = b"", 0, None

    def call(self, method, timeout=30, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        raise AssertionError("%s: %s" % (method, reply["error"]))
                    return reply["result"]
            data = os.read(self.out_r, 1 << 20)
            if not data:
                raise AssertionError("chromium exited")
            self.buffer += data
        raise AssertionError("no reply to " + method)

    def js(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError("%s: %s" % (expression, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait_for(self, expression, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.js(expression)
            except AssertionError:  # the page is not there yet
                value = None
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError("timed out waiting for " + expression)

    def type_and_send(self, text):
        self.js("document.getElementById('input').focus()")
        self.call("Input.insertText", text=text)
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13)

    def open_page(self, url):
        target = self.call("Target.createTarget", url=url)["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def pick_files(self, selector, paths):
        """Files chosen in a file input, as the picker would (its change event fires)."""
        node = self.call("Runtime.evaluate", expression="document.querySelector(%s)" % json.dumps(selector))["result"]
        self.call("DOM.setFileInputFiles", files=[str(p) for p in paths], objectId=node["objectId"])

    def hand_over(self, event, name, data, mime):
        """A file dropped on the page ("drop") or pasted into the input ("paste"), as a DataTransfer
        event built in the page from the file's bytes."""
        self.js("""(() => {
            const bytes = Uint8Array.from(atob(%s), (c) => c.charCodeAt(0));
            const dt = new DataTransfer();
            dt.items.add(new File([bytes], %s, { type: %s }));
            const input = document.getElementById('input');
            if (%s === 'paste') input.dispatchEvent(new ClipboardEvent('paste', { clipboardData: dt, bubbles: true, cancelable: true }));
            else input.dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
        })()""" % (json.dumps(base64.b64encode(data).decode()), json.dumps(name), json.dumps(mime), json.dumps(event)))

    def screenshot(self, name):
        shot = self.call("Page.captureScreenshot", format="png")["data"]
        os.makedirs(os.path.join(BUILD, "test-artifacts"), exist_ok=True)
        with open(os.path.join(BUILD, "test-artifacts", name), "wb") as f:
            f.write(base64.b64decode(shot))

    def close(self):
        self.proc.kill()
        self.proc.wait()
        os.close(self.cmd_w)
        os.close(self.out_r)
        shutil.rmtree(self.scratch, ignore_errors=True)


@pytest.mark.skipif(not CHROMIUM, reason="no chromium installed (Debian: apt-get install chromium)")
def test_chat_page(default_model, tmp_path):
    server = Server(default_model, "-c", "2048", "--parallel", "2", log_dir=tmp_path)
    browser = Browser(tmp_path / "chromium-profile")
    try:
        browser.open_page(server.url + "/")
        info = browser.wait_for("(t => t.includes('plan') && t)(document.getElementById('model-info').textContent)")
        assert "SmolLM2-135M-Instruct" in info and "CPU only" in info and "plan cpu" in info, info
        assert browser.js("document.getElementById('attach').hidden")  # a text-only server: nothing to attach
        browser.js("document.getElementById('temperature').value = '0'")
        browser.type_and_send("What is the capital of France?")
        answer = browser.wait_for("(m => m && m.textContent)(document.querySelector('.msg.assistant[data-done]'))")
        assert "Paris" in answer and "TTFT" in answer and "tok/s" in answer, answer
        assert browser.js("document.querySelector('.msg.user').textContent") == "What is the capital of France?"
        browser.type_and_send("And what is the capital of Italy?")
        browser.wait_for("document.querySelectorAll('.msg.assistant[data-done]').length == 2")
        assert browser.js("conversation.length") == 4  # both questions and both answers go with the next one
        second = browser.js("document.querySelectorAll('.msg.assistant')[1].textContent")
        assert "Rome" in second, second
        browser.screenshot("chat_page.png")
    finally:
        browser.close()
        assert server.stop() == 0


def data_url(path):
    return "data:image/png;base64," + base64.b64encode(open(path, "rb").read()).decode()


def flat_png(side):
    """A one-colour side x side PNG: a few kilobytes, however many image tokens it makes."""
    from PIL import Image
    out = io.BytesIO()
    Image.new("RGB", (side, side), (90, 140, 200)).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.skipif(not CHROMIUM, reason="no chromium installed (Debian: apt-get install chromium)")
def test_chat_page_images(tmp_path):
    pytest.importorskip("PIL.Image")
    n = 12
    rng = write_tiny_vlm(tmp_path)  # a.png: 7 x 11 image tokens, b.png: 4 x 3
    (tmp_path / "flat.png").write_bytes(flat_png(1000))  # 36 x 36 image tokens: more than the context
    server = Server(str(tmp_path / "tiny-qwen25vl.gguf"), "--mmproj", str(tmp_path / "tiny-qwen25vl-mmproj.gguf"),
                    "-c", "1024", "--parallel", "1", "--max-body", "1M", log_dir=tmp_path)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    browser = Browser(tmp_path / "chromium-profile")

    def answer_of(i):
        """The i-th answer (0-based) once it is done: its text as the page streamed it."""
        browser.wait_for("document.querySelectorAll('.msg.assistant[data-done], .msg.error[data-done]').length > %d" % i)
        return browser.js("document.querySelectorAll('#messages > .msg')[%d].firstChild.nodeValue" % (2 * i + 1))

    def api_reply(messages):
        r = client.chat.completions.create(model="any", messages=messages, temperature=0, max_tokens=n)
        return r.choices[0].message.content, r.usage

    try:
        browser.open_page(server.url + "/")
        info = browser.wait_for("(t => t.includes('plan') && t)(document.getElementById('model-info').textContent)")
        assert "reads images" in info, info
        assert not browser.js("document.getElementById('attach').hidden")
        assert browser.js("document.getElementById('file').accept") == "image/png,image/jpeg"
        browser.js("document.getElementById('temperature').value = '0'")
        browser.js("document.getElementById('max-tokens').value = '%d'" % n)

        # an image through the file picker, removed, picked again, and sent with a question
        browser.pick_files("#file", [tmp_path / "b.png"])
        browser.wait_for("document.querySelectorAll('#attachments img').length == 1")
        browser.js("document.querySelector('#attachments .remove').click()")
        assert browser.js("document.querySelectorAll('#attachments img').length") == 0
        browser.pick_files("#file", [tmp_path / "b.png"])
        browser.wait_for("document.querySelectorAll('#attachments img').length == 1")
        browser.type_and_send("Describe: ")
        first = answer_of(0)
        assert browser.js("document.querySelectorAll('#attachments img').length") == 0  # sent with the message
        assert browser.js("document.querySelector('.msg.user img.thumb').src") == data_url(tmp_path / "b.png")
        assert browser.js("document.querySelector('.msg.user').textContent") == "Describe:"
        sent = json.loads(browser.js("JSON.stringify(conversation)"))
        assert sent[0] == {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(tmp_path / "b.png")}}, {"type": "text", "text": "Describe:"}]}
        assert first and sent[1] == {"role": "assistant", "content": first}
        assert api_reply(sent[:1])[0] == first

        # a second image, pasted: the first stays in the conversation the page sends again
        browser.hand_over("paste", "a.png", (tmp_path / "a.png").read_bytes(), "image/png")
        browser.wait_for("document.querySelectorAll('#attachments img').length == 1")
        browser.type_and_send("And this?")
        second = answer_of(1)
        sent = json.loads(browser.js("JSON.stringify(conversation)"))
        assert len(sent) == 4 and sent[2]["content"][0]["image_url"]["url"] == data_url(tmp_path / "a.png")
        reply, usage = api_reply(sent[:3])
        assert second and reply == second
        assert usage.prompt_tokens_details.cached_tokens > 77 + 12  # both images' cells, reused by content
        assert browser.js("document.querySelectorAll('.msg.user img.thumb').length") == 2

        # refused on the page: not an image, and an image over --max-body (1 MiB)
        browser.hand_over("drop", "notes.txt", b"not an image", "text/plain")
        assert "not a PNG or JPEG" in browser.wait_for("document.getElementById('notice').textContent")
        browser.hand_over("drop", "big.png", random_image(rng, 700, 700), "image/png")
        notice = browser.wait_for("(t => t.includes('big.png') && t)(document.getElementById('notice').textContent)")
        assert "too large" in notice and "--max-body" in notice, notice
        assert browser.js("document.querySelectorAll('#attachments img').length") == 0

        # refused by the server (more image tokens than a sequence holds): its message in the
        # conversation, and the message out of what the next request carries
        browser.pick_files("#file", [tmp_path / "flat.png"])
        browser.wait_for("document.querySelectorAll('#attachments img').length == 1")
        assert browser.js("document.getElementById('notice').hidden")
        browser.type_and_send("Too big?")
        browser.wait_for("!!document.querySelector('.msg.error[data-done]')")
        error = browser.js("document.querySelector('.msg.error').textContent")
        assert "error: " in error and "raise -c" in error, error
        assert browser.js("conversation.length") == 4
        browser.pick_files("#file", [tmp_path / "b.png"])  # the screenshot shows one waiting in the input too
        browser.wait_for("document.querySelectorAll('#attachments img').length == 1")
        browser.screenshot("chat_page_vision.png")
    finally:
        browser.close()
        assert server.stop() == 0, server.log_text()
