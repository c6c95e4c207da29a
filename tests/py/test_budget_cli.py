"""The VRAM budget while running, CPU side of its controls: `POST /v1/pshard/budget` on `pshard
serve` (the API key, malformed bodies named, a budget below the model's least naming it, a server
on the CPU alone refusing any other, nothing changed by a refused one, the budget in /props and
/metrics), and --vram-budget auto / --budget-file on run, chat and serve (refused where they
cannot apply, with the reason). The GPU side: tests/device/test_budget_change.py."""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import BUILD, run_pshard
from server_helpers import Server


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory):
    s = Server(default_model, "-c", "1024", "--api-key", "sesame", log_dir=tmp_path_factory.mktemp("serve"))
    yield s
    assert s.stop() == 0, s.log_text()


KEY = {"Authorization": "Bearer sesame"}


def budget(server, body, key=True, raw=None):
    return server.request("POST", "/v1/pshard/budget", body, headers=KEY if key else None, raw=raw)


def props(server):
    status, _, body = server.request("GET", "/props", headers=KEY)
    assert status == 200
    return body


def test_key_required(server):
    assert budget(server, {"vram_budget": "4G"}, key=False)[0] == 401
    assert server.request("GET", "/v1/pshard/budget", headers=KEY)[0] == 405


@pytest.mark.parametrize("raw, needle", [
    (b"{not json", "not valid JSON"),
    (b"[]", "JSON object"),
    (b"{}", "'vram_budget' is required"),
    (b'{"vram_budget": true}', "must be a size"),
    (b'{"vram_budget": -5}', "must be a size"),
    (b'{"vram_budget": 1.5}', "must be a size"),
    (b'{"vram_budget": ""}', "must be a size"),
    (b'{"vram_budget": "4Q"}', "4Q"),
    (b'{"vram_budget": "auto:kep=1G"}', "auto[:keep=SIZE]"),
    (b'{"vram_budget": "auto:keep=-1G"}', "keep"),
])
def test_bad_bodies_named(server, raw, needle):
    before = props(server)
    status, _, body = budget(server, None, raw=raw)
    assert status == 400, body
    assert needle in body["error"]["message"]
    after = props(server)
    assert after["vram"]["budget"] == before["vram"]["budget"] and after["plan"] == before["plan"]


def test_below_least_names_it(server):
    status, _, body = budget(server, {"vram_budget": 1})
    assert status == 400 and body["error"]["code"] == "invalid_budget", body
    assert re.search(r"minimum for this model and context is \d+ MB", body["error"]["message"])
    assert body["error"]["param"] == "vram_budget"


def test_cpu_server_refuses_a_gpu_budget(server):
    """The server opened on the CPU alone (no --vram-budget): nothing to change, said so."""
    status, _, body = budget(server, {"vram_budget": "8G"})
    assert status == 409 and "CPU alone" in body["error"]["message"], body
    status, _, body = budget(server, {"vram_budget": "auto"})
    assert status == 409 and "CPU alone" in body["error"]["message"], body
    status, _, body = budget(server, {"vram_budget": 0})  # the budget it has: fine
    assert status == 200 and body["vram_budget_bytes"] == 0 and body["changes"] == 0, body
    p = props(server)
    assert p["vram"]["budget_bytes"] == 0 and p["vram"]["budget"]["follow"] is False
    status, _, metrics = server.request("GET", "/metrics", headers=KEY)
    assert status == 200
    for name in ("vram_budget_bytes 0", "vram_budget_follow 0", "vram_budget_changes_total 0"):
        assert "pshard_" + name in metrics
    # and it still serves
    status, _, reply = server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, headers=KEY)
    assert status == 200 and reply["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("args, needle", [
    (["--vram-budget", "auto:kep=1G"], "auto[:keep=SIZE]"),
    (["--vram-budget", "auto", "--gpu"], "leave --gpu"),
    (["--vram-budget", "auto", "--plan", "cpu"], "leave --gpu and --plan cpu out"),
])
def test_run_refuses(default_model, args, needle):
    proc = run_pshard("run", "-m", default_model, "-p", "x", "-n", "1", *args, check=False)
    assert proc.returncode != 0 and needle in proc.stderr, proc.stderr


def test_serve_refuses_budget_file(default_model, tmp_path):
    proc = run_pshard("serve", "-m", default_model, "--budget-file", str(tmp_path / "b"), check=False)
    assert proc.returncode == 2 and "POST /v1/pshard/budget" in proc.stderr


def wait_for(log_path, needle, count=1, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if text.count(needle) >= count:
            return text
        time.sleep(0.05)
    raise AssertionError("no %r in: %s" % (needle, text))


def test_budget_file_read_while_chat_waits(default_model, tmp_path):
    """chat reads its budget file again when the file changes and on SIGUSR1, while it waits for a
    line: on the CPU alone a GPU budget is refused with the reason and 0 is taken; then it chats."""
    path, log = tmp_path / "budget", tmp_path / "chat.log"
    path.write_text("0\n")
    with open(log, "w") as err:
        proc = subprocess.Popen([os.path.join(BUILD, "pshard"), "chat", "-m", default_model, "-t", "2", "--temp", "0",
                                 "-n", "4", "--budget-file", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err)
    try:
        time.sleep(1.0)  # loaded (a small model) and waiting for a line; its mtime was recorded then
        path.write_text("8G\n")
        os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
        text = wait_for(log, "the budget stays")
        assert "--budget-file %s ('8G')" % path in text and "CPU alone" in text, text
        path.write_text("auto:kep=1G")
        proc.send_signal(signal.SIGUSR1)  # read at once, the modification time aside
        text = wait_for(log, "the budget stays", count=2)
        assert "auto[:keep=SIZE]" in text, text
        path.write_text("0")
        proc.send_signal(signal.SIGUSR1)
        text = wait_for(log, "VRAM budget 0 B (was 0 B)")
        out, _ = proc.communicate(b"Hello\n", timeout=120)
        assert proc.returncode == 0 and out.strip(), open(log).read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_auto_needs_a_gpu(default_model):
    proc = run_pshard("run", "-m", default_model, "-p", "x", "-n", "1", "--vram-budget", "auto:keep=2G", check=False)
    if "no CUDA device" not in proc.stderr:
        pytest.skip("a GPU is here: tests/device/test_budget_change.py covers auto")
    assert proc.returncode != 0
