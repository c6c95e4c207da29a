"""How a reply of `pshard run` ends, as a user reads it: a line says why it ended (the model's end of
text, the -n limit or a full context, as the API's finish_reason names it), a character cut by the
limit is never half printed, and the weights read per token count the steps that ran, the one that
gave the end of text included."""
import os
import re
import subprocess

from conftest import BUILD


def run(default_model, *args):
    proc = subprocess.run([os.path.join(BUILD, "pshard"), "run", "-m", default_model, "-t", "2", "--temp", "0", *args],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr.decode("utf-8")


def test_the_reason_a_reply_ended_is_said(default_model):
    _, err = run(default_model, "-p", "Say hi", "-n", "200")
    assert re.search(r"^finish: stop \(end of text\)$", err, re.M), err
    _, err = run(default_model, "-p", "Hello", "-n", "5", "--ignore-eos")
    assert re.search(r"^finish: length \(-n 5 reached\)$", err, re.M), err
    _, err = run(default_model, "-p", "Hello", "-n", "-1", "-c", "40", "--ignore-eos")
    assert re.search(r"^finish: length \(the context of 40 tokens is full; -c sets it\)$", err, re.M), err
    _, err = run(default_model, "-p", "Hello", "-n", "5", "-q")
    assert "finish" not in err, err  # -q: no report
    _, err = run(default_model, "-p", "Hello", "-n", "0")
    assert "finish" not in err, err  # nothing was generated


def test_a_character_cut_by_the_limit_is_not_printed(default_model):
    """The emoji the model repeats are four bytes over two or three tokens each: some limits fall
    inside one. Each cut reply is the whole one's text up to its last whole character."""
    prompt = ["-p", "Repeat exactly: \U0001F600\U0001F600\U0001F600 \u65e5\u672c\u8a9e", "-q", "--ignore-eos"]
    whole, _ = run(default_model, *prompt, "-n", "40")
    whole = whole.decode("utf-8")
    texts = []
    for n in range(20, 31):
        out, _ = run(default_model, *prompt, "-n", str(n))
        text = out.decode("utf-8")  # strict: a stray byte fails here
        assert "\ufffd" not in text, (n, text)
        assert text.endswith("\n") and whole.startswith(text[:-1]), (n, text, whole)
        texts.append(text)
    assert "\ufffd" not in whole
    # Some token added bytes but no whole character: a limit fell inside one.
    assert any(a == b for a, b in zip(texts, texts[1:])), texts


def test_weights_read_per_token_count_the_steps_run(default_model):
    """On the CPU every step reads every weight: a reply ended by the model reads as much per token
    as one cut by -n (it ran one step more than it printed tokens, and that step counts)."""
    per_token = re.compile(r"^decode: (\d+) tokens at [\d.]+ tok/s; ([\d.]+ [KMG]?B) of weights read per token", re.M)
    _, err = run(default_model, "-p", "Say hi", "-n", "200")
    ended = per_token.search(err)
    assert ended and int(ended.group(1)) < 200 and "finish: stop" in err, err
    _, err = run(default_model, "-p", "Say hi", "-n", "5", "--ignore-eos")
    cut = per_token.search(err)
    assert cut, err
    assert ended.group(2) == cut.group(2), (ended.group(0), cut.group(0))


def test_chat_says_why_each_answer_ended(default_model):
    proc = subprocess.run([os.path.join(BUILD, "pshard"), "chat", "-m", default_model, "-t", "2", "-n", "4",
                           "--ignore-eos"], input="Hello\nAnd again\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("finish: length (-n 4 reached)") == 2, proc.stderr


def test_batch_leaves_a_cut_character_out(default_model):
    """pshard batch (the server's engine) ends replies cut by -n as run does: the text up to the
    last whole character, no U+FFFD."""
    prompt = "Repeat exactly: \U0001F600\U0001F600\U0001F600 \u65e5\u672c\u8a9e"
    whole, _ = run(default_model, "-p", prompt, "-q", "--ignore-eos", "-n", "40")
    whole = whole.decode("utf-8")
    args = [os.path.join(BUILD, "pshard"), "batch", "-m", default_model, "-t", "2", "--temp", "0", "--ignore-eos",
            "--jsonl", "--parallel", "4"]
    import json
    for n in range(20, 31):
        proc = subprocess.run(args + ["-n", str(n), "-p", prompt], capture_output=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        reply = json.loads(proc.stdout.decode("utf-8").strip().splitlines()[-1])
        assert "\ufffd" not in reply["text"], (n, reply)
        assert whole.startswith(reply["text"]), (n, reply["text"], whole)
