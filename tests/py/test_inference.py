"""End-to-end inference checks: greedy output against llama.cpp's (committed fixtures made by
tests/data/llamacpp/make_fixtures.py), logits against the independent numpy reference, and the
behaviour of pshard run/eval on bad input."""
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import BUILD, ROOT, run_pshard

FIXTURES = os.path.join(ROOT, "tests", "data", "llamacpp", "default_model.json")


def load_cases():
    with open(FIXTURES) as f:
        return json.load(f)["cases"]


def generated_ids(stdout):
    line = [l for l in stdout.splitlines() if l.startswith("ids:")][-1]
    return [int(x) for x in line.split()[1:]]


# Both engines round activations to 8 bits before every matrix product; a last-bit difference
# in any float sum flips a few roundings, which spread through the layers. llama.cpp disagrees
# with itself this way: evaluating these prompts' tokens as one batch or one by one changes
# its logits by up to 1.8 and the gap between its two best tokens by up to 0.5 (1.1 on one
# prompt). Where llama.cpp's best token leads its second by less than NEAR_TIE, either choice
# is correct and the continuations may part.
NEAR_TIE = 0.6


def greedy_ids(model, prompt):
    proc = run_pshard("run", "-m", model, "--raw", "--temp", "0", "-n", "64", "--ids", "-q", "-p", prompt)
    return generated_ids(proc.stdout)


@pytest.mark.parametrize("case", load_cases(), ids=lambda c: c["prompt"][:24])
def test_greedy_tokens_match_llama_cpp(default_model, case):
    ours, ref = greedy_ids(default_model, case["prompt"]), case["generated"]
    for step, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            assert case["margins"][step] < NEAR_TIE, (
                "step %d: pshard chose %d, llama.cpp %d which led by %.3f" % (step, a, b, case["margins"][step]))
            assert a == case["runner_up"][step], "step %d: pshard's token is not llama.cpp's second choice" % step
            return  # after a near-tie the continuations legitimately differ
    assert len(ours) == len(ref)


def test_robust_prompts_are_identical_for_64_tokens(default_model):
    """Prompts whose greedy path never passes a near-tie must give llama.cpp's tokens exactly."""
    robust = [c for c in load_cases() if min(c["margins"]) >= NEAR_TIE]
    assert len(robust) >= 2
    for case in robust:
        assert greedy_ids(default_model, case["prompt"]) == case["generated"], case["prompt"]


def test_prompt_tokens_match_llama_cpp(default_model, tmp_path):
    for case in load_cases():
        proc = run_pshard("eval", "-m", default_model, "-p", case["prompt"], "-o", str(tmp_path / "l.f32"))
        n = len(proc.stdout.split()) - 1
        assert n == len(case["prompt_tokens"]), case["prompt"]
        logits = np.fromfile(tmp_path / "l.f32", dtype=np.float32).reshape(n, -1)
        # llama.cpp's top-5 at the last prompt position: logits within the rounding noise, and the
        # same best token unless llama.cpp's own top two are within NEAR_TIE.
        last = logits[-1]
        np.testing.assert_allclose(last[case["top5_ids"]], case["top5_logits"], atol=1.0)
        if case["top5_logits"][0] - case["top5_logits"][1] >= NEAR_TIE:
            assert int(np.argmax(last)) == case["top5_ids"][0], case["prompt"]


def test_eval_rejects_bad_tokens(default_model, tmp_path):
    proc = run_pshard("eval", "-m", default_model, "--tokens", "1,99999999", "-o", str(tmp_path / "x"), check=False)
    assert proc.returncode == 1
    assert "outside the vocabulary" in proc.stderr


def test_prompt_longer_than_context_is_a_clear_error(default_model):
    proc = run_pshard("run", "-m", default_model, "-c", "16", "--raw", "-p", "word " * 40, check=False)
    assert proc.returncode == 1
    assert "context" in proc.stderr and "-c" in proc.stderr


def test_generation_stops_at_context_end(default_model):
    proc = run_pshard("run", "-m", default_model, "-c", "24", "--raw", "--temp", "0", "-n", "100", "--ids",
                      "-p", "Count: 1, 2, 3,")
    assert 0 < len(generated_ids(proc.stdout)) < 24


def test_same_seed_same_text(default_model):
    def story(seed):
        return run_pshard("run", "-m", default_model, "--temp", "1.0", "--seed", str(seed), "-n", "24", "-q",
                          "-p", "Tell me a story.").stdout
    a, b, c = story(7), story(7), story(8)
    assert a == b
    assert a != c


def test_capital_of_france(default_model):
    proc = run_pshard("run", "-m", default_model, "--temp", "0", "-n", "32", "-p", "What is the capital of France?")
    assert "Paris" in proc.stdout
    assert "tok/s" in proc.stderr and "GB/s" in proc.stderr


def test_chat_keeps_history(default_model):
    exe = os.path.join(BUILD, "pshard")
    proc = subprocess.run([exe, "chat", "-m", default_model, "--temp", "0", "-n", "24", "-q"],
                          input="Remember the number 42.\nWhat number did I ask you to remember?\n/exit\n",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    second_reply = proc.stdout.split("\n", 1)[1]
    assert "42" in second_reply


def test_bad_options_are_clear(default_model):
    proc = run_pshard("run", "-m", default_model, "--top-p", "7", "-p", "x", check=False)
    assert proc.returncode == 2 and "--top-p" in proc.stderr
    proc = run_pshard("run", "-m", default_model, check=False)
    assert proc.returncode == 2 and "prompt" in proc.stderr
    proc = run_pshard("run", "-m", "/nonexistent.gguf", "-p", "x", check=False)
    assert proc.returncode == 1 and "/nonexistent.gguf" in proc.stderr
