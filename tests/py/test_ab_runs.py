"""bench/ab_runs.py (the runs themselves need the models and usually a GPU): builds run in turn
with the same `pshard run` arguments, `pshard run`'s report read into the table with each build's
medians and the md5 of what it generated, and clear errors for what cannot run."""
import hashlib
import os
import subprocess
import sys

from conftest import BENCH, load_bench

TOOL = os.path.join(BENCH, "ab_runs.py")
ab = load_bench("ab_runs")

REPORT = ("finish: length (-n 128 reached)\n"
          "prompt: 903 tokens (0 reused) in {pm} ms = 9478.2 tok/s; TTFT {ttft} ms; 0 B of weights over PCIe\n"
          "decode: 128 tokens at {tps} tok/s; 1.75 GB of weights read per token = 454.2 GB/s (16 threads)\n")


def test_report_read():
    r = ab.parse("VRAM: ...\n" + REPORT.format(pm=95, ttft=96, tps=258.9))
    assert r == {"prompt_tokens": 903, "prompt_ms": 95.0, "ttft_ms": 96.0, "decode_tokens": 128, "decode_tps": 258.9}
    assert ab.parse("pshard: cannot open") == dict.fromkeys(r)


def test_builds_alternate():
    assert ab.order(2, 2) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert ab.order(3, 1) == [(0, 0), (0, 1), (0, 2)]


def fake_pshard(tmp_path, name, tps, text, log):
    """A stand-in that logs its name and arguments, prints `text` and a report at tps tok/s."""
    path = tmp_path / name
    path.write_text("#!%s\nimport sys\nopen(%r, 'a').write(%r + ' ' + ' '.join(sys.argv[1:]) + '\\n')\n"
                    "sys.stdout.write(%r)\nsys.stderr.write(%r)\n"
                    % (sys.executable, str(log), name, text, REPORT.format(pm=90, ttft=91, tps=tps)))
    path.chmod(0o755)
    return str(path)


def test_two_builds_side_by_side(tmp_path):
    log = tmp_path / "calls.txt"
    a = fake_pshard(tmp_path, "base", 258.4, "the same words", log)
    b = fake_pshard(tmp_path, "new", 325.3, "other words", log)
    p = subprocess.run([sys.executable, TOOL, "--runs", "2", a, b, "--", "-m", "m.gguf", "--gpu", "-p", "hi there"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    calls = log.read_text().splitlines()
    assert calls == ["base run -m m.gguf --gpu -p hi there", "new run -m m.gguf --gpu -p hi there"] * 2
    rows = p.stdout.splitlines()
    md5 = hashlib.md5(b"the same words").hexdigest()[:8]
    assert rows[2] == "| %s | 1 | 903 | 90 | 91 | 258.4 | %s |" % (a, md5)
    assert rows[3].startswith("| %s | 1 | 903 | 90 | 91 | 325.3 |" % b)
    assert rows[-2] == "| %s | median | | 90 | 91 | 258.4 | |" % a
    assert rows[-1] == "| %s | median | | 90 | 91 | 325.3 | |" % b


def test_what_cannot_run_is_said(tmp_path):
    for args, words in [([], "give the builds"), (["a", "--", "-m", "m"], "two builds"),
                        (["a", "b", "--"], "no arguments"), (["--runs", "0", "a", "b", "--", "-p", "x"], "--runs"),
                        ([str(tmp_path / "none"), str(tmp_path / "none2"), "--", "-p", "x"], "none")]:
        p = subprocess.run([sys.executable, TOOL] + args, capture_output=True, text=True)
        assert p.returncode != 0 and words in p.stderr, (args, p.stderr)
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'pshard: m.gguf: cannot open' >&2\nexit 1\n")
    failing.chmod(0o755)
    ok = fake_pshard(tmp_path, "ok", 100.0, "x", tmp_path / "log")
    p = subprocess.run([sys.executable, TOOL, "--runs", "1", str(failing), ok, "--", "-m", "m.gguf"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "cannot open" in p.stderr
    assert "| exit 1 |" in p.stdout and "| 100.0 |" in p.stdout
    p = subprocess.run([sys.executable, TOOL, "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "Usage:" in p.stdout
