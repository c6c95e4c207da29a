"""`pshard chat` as a user meets it: Ctrl-C stops the answer being generated and keeps the
conversation (a Ctrl-C at the prompt ends the chat), and the chat's own /commands are listed by
/help, while an unknown /word is refused rather than sent to the model."""
import os
import re
import subprocess
import time

import pytest

from conftest import BUILD


def test_ctrl_c_stops_the_answer_and_keeps_the_conversation(default_model):
    pexpect = pytest.importorskip("pexpect")
    # Answers that would run 300 tokens (over ten seconds here): the first Ctrl-C cuts each short.
    child = pexpect.spawn(os.path.join(BUILD, "pshard"),
                          ["chat", "-m", default_model, "-t", "2", "-c", "2048", "-n", "300", "--ignore-eos"],
                          encoding="utf-8", timeout=60, dimensions=(50, 200))
    try:
        child.expect_exact("> ")
        turns = []
        for question in ("Count from one to one hundred in words.", "Go on counting."):
            child.sendline(question)
            child.expect_exact(question)  # the terminal's echo
            child.expect(r"(?s)\w.{40}")  # the answer has begun: some ten tokens of it
            time.sleep(0.5)
            started = time.monotonic()
            child.sendintr()
            child.expect_exact("(stopped)")
            assert time.monotonic() - started < 5, "the answer went on after Ctrl-C"
            child.expect(r"prompt: (\d+) tokens \((\d+) reused\)")
            turns.append((int(child.match.group(1)), int(child.match.group(2))))
            child.expect_exact("> ")
            assert child.isalive()
        (first_new, first_reused), (second_new, second_reused) = turns
        assert first_reused == 0
        # The second turn reuses the first question and its answer as far as it got: the cache
        # kept the conversation, so only the new turn was processed.
        assert second_reused >= first_new + 3, turns
        child.sendintr()  # at the prompt: the chat ends
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0 and child.signalstatus is None
    finally:
        if child.isalive():
            child.terminate(force=True)


def chat(default_model, text):
    return subprocess.run([os.path.join(BUILD, "pshard"), "chat", "-m", default_model, "-q", "-t", "2", "-n", "4"],
                          input=text, capture_output=True, text=True, timeout=120)


def test_commands_are_listed_and_unknown_ones_refused(default_model):
    proc = chat(default_model, "/help\n/frobnicate now\n/quit\n")
    assert proc.returncode == 0, proc.stderr
    for command in ("/help", "/reset", "/quit"):
        assert re.search(r"^  %s\s+\S" % command, proc.stderr, re.M), proc.stderr
    assert "unknown command '/frobnicate'; /help lists the commands" in proc.stderr
    assert proc.stdout == ""  # nothing went to the model
    # A line starting with // is sent, less one slash; the chat goes on after it.
    proc = chat(default_model, "//etc is a folder?\n/exit\n")
    assert proc.returncode == 0 and "unknown command" not in proc.stderr, proc.stderr
    assert proc.stdout.strip(), proc.stdout


def test_n_0_answers_nothing(default_model):
    proc = chat(default_model, "Hello\nHi again\n")
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    proc = subprocess.run([os.path.join(BUILD, "pshard"), "chat", "-m", default_model, "-q", "-t", "2", "-n", "0"],
                          input="Hello\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "", (proc.stdout, proc.stderr)
