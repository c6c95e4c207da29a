"""Starting and stopping `pshard serve` for the server tests: a free port, the log in a file, ready
when /health says ok."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

from conftest import BUILD


class Server:
    def __init__(self, model, *args, log_dir):
        self.log_path = os.path.join(str(log_dir), "serve-%d.log" % time.monotonic_ns())
        self.log = open(self.log_path, "w+b")
        self.proc = subprocess.Popen([os.path.join(BUILD, "pshard"), "serve", "-m", model, "--port", "0", "-t", "2",
                                      *args], stdout=self.log, stderr=self.log)
        self.url = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = self.log_text()
            m = re.search(r"listening on http://([^ ]+)", text)
            if m and not self.url:
                self.url = "http://" + m.group(1)
            if self.url and "ready:" in text:
                return
            if self.proc.poll() is not None:
                raise AssertionError("pshard serve exited (%d): %s" % (self.proc.returncode, text))
            time.sleep(0.05)
        self.stop()
        raise AssertionError("pshard serve did not become ready: " + self.log_text())

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, headers, parsed JSON or text) of one request."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                status, hdrs, text = r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            status, hdrs, text = e.code, e.headers, e.read().decode()
        try:
            return status, hdrs, json.loads(text)
        except ValueError:
            return status, hdrs, text

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
