"""The chat page of `pshard serve` in headless Chromium (Debian's chromium), driven through the
Chrome DevTools protocol over a pipe (--remote-debugging-pipe: no extra Python package): the page
shows the model and plan, a typed question gets a streamed answer with its TTFT and speed, a second
question continues the conversation. A screenshot is kept under the build directory
(test-artifacts/chat_page.png). Skipped where no Chromium is installed."""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from conftest import BUILD
from server_helpers import Server

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
        target = browser.call("Target.createTarget", url=server.url + "/")["targetId"]
        browser.session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        info = browser.wait_for("(t => t.includes('plan') && t)(document.getElementById('model-info').textContent)")
        assert "SmolLM2-135M-Instruct" in info and "CPU only" in info and "plan cpu" in info, info
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
        shot = browser.call("Page.captureScreenshot", format="png")["data"]
        os.makedirs(os.path.join(BUILD, "test-artifacts"), exist_ok=True)
        with open(os.path.join(BUILD, "test-artifacts", "chat_page.png"), "wb") as f:
            f.write(base64.b64decode(shot))
    finally:
        browser.close()
        assert server.stop() == 0
