"""`pshard batch` on the CPU: each prompt of a continuously batched run (two sequences at once,
prompts joining one a step while others decode) gives the greedy tokens `pshard run` gives it
alone, on the default model through its chat template and on a tiny synthetic MoE model; replies
carry why they ended; bad options are refused naming them."""
import json
import os
import subprocess

import pytest

from conftest import BUILD, run_pshard

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Count from one to ten.",
           "Name three fruits.", "Why is the sky blue?"]


def alone_ids(model, prompt, extra):
    out = run_pshard("run", "-m", model, "-p", prompt, "--temp", "0", "-n", "16", "--ids", "-q", "-t", "2", *extra).stdout
    return [int(x) for x in [l for l in out.splitlines() if l.startswith("ids:")][-1].split()[1:]]


def batched(model, prompts, extra):
    args = ["batch", "-m", model, "--temp", "0", "-n", "16", "--jsonl", "-q", "-t", "2", "--parallel", "2",
            "--stagger", "1"]
    for p in prompts:
        args += ["-p", p]
    out = run_pshard(*args, *extra).stdout
    return {json.loads(l)["index"]: json.loads(l) for l in out.splitlines()}


def check_equal(model, prompts, extra):
    got = batched(model, prompts, extra)
    assert sorted(got) == list(range(1, len(prompts) + 1))
    for i, prompt in enumerate(prompts, 1):
        ref = alone_ids(model, prompt, extra)
        assert got[i]["ids"] == ref, "prompt %d: batched %s, alone %s" % (i, got[i]["ids"], ref)
        assert got[i]["finish"] == ("length" if len(ref) == 16 else "stop")
        assert got[i]["n_generated"] == len(ref)


def test_batch_equals_alone_default_model(default_model):
    check_equal(default_model, PROMPTS, [])


def test_batch_equals_alone_tiny_moe(tmp_path):
    path = str(tmp_path / "tiny-moe.gguf")
    subprocess.run([os.path.join(BUILD, "gguf-synth"), "--shape", "tiny-moe", "--type", "Q4_K", "--seed", "5", "-o",
                    path, "--quiet"], check=True)
    check_equal(path, ["The capital of France is", "1, 2, 3,", "Once upon a time", "x"], ["--raw", "--ignore-eos"])


def test_prompts_from_a_file(default_model, tmp_path):
    """-f FILE: a prompt a line (empty lines skipped), the same replies as -p; one file at most,
    of at most 4096 prompts."""
    f = tmp_path / "prompts.txt"
    f.write_text(PROMPTS[0] + "\n\n" + PROMPTS[1] + "\n")
    out = run_pshard("batch", "-m", default_model, "-f", str(f), "--temp", "0", "-n", "8", "--jsonl", "-q", "-t", "2").stdout
    got = {json.loads(l)["index"]: json.loads(l) for l in out.splitlines()}
    assert sorted(got) == [1, 2]
    assert got[2]["ids"] == alone_ids(default_model, PROMPTS[1], ["-n", "8"])[:8]
    proc = run_pshard("batch", "-m", default_model, "-f", str(f), "--file", str(f), check=False)
    assert proc.returncode == 2 and "one -f FILE" in proc.stderr
    many = tmp_path / "many.txt"
    many.write_text("".join("prompt %d\n" % i for i in range(4097)))
    proc = run_pshard("batch", "-m", default_model, "-f", str(many), check=False)
    assert proc.returncode == 2 and "at most 4096 prompts" in proc.stderr


@pytest.mark.parametrize("args, needle", [
    (["--parallel", "0"], "--parallel"), (["--parallel", "2.5"], "--parallel"), (["--stagger", "nan"], "--stagger"),
    ([], "give prompts"),
])
def test_batch_refuses_bad_options(default_model, args, needle):
    proc = run_pshard("batch", "-m", default_model, *args, *(["-p", "hi"] if needle != "give prompts" else []),
                      check=False)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, needle", [
    (["-b", "2.5"], "-b takes a whole number"), (["-t", "0"], "-t takes a whole number"),
    (["--reps", "nan"], "--reps takes a whole number"), (["--batch", "-npl", "0"], "-npl"),
    (["--batch", "-npp", "1e3"], "-npp"),
])
def test_bench_refuses_bad_numbers(default_model, args, needle):
    proc = run_pshard("bench", "--oracle", "-m", default_model, *args, check=False) if "--batch" not in args else \
        run_pshard("bench", "-m", default_model, *args, check=False)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_bench_batch_runs_every_sequence_at_once(default_model, tmp_path):
    # 16 + 12 cells a sequence take one block of the KV pool each: all 8 sequences run together,
    # one prompt step and 11 decode steps, not a few at a time.
    out = tmp_path / "b.json"
    run_pshard("bench", "--batch", "-m", default_model, "-npp", "16", "-ntg", "12", "-npl", "8", "-t", "2", "-q",
               "--json", str(out))
    row = json.loads(out.read_text().splitlines()[0])
    assert row["npl"] == 8 and row["steps"] == 12, row
    assert row["gen_tps"] > 0 and row["prompt_tps"] > 0, row
    # Every sequence generates from the second step to the last: the steady figure has 11 steps.
    assert row["steady_gen_tps"] > 0, row


def test_bench_batch_steady_needs_every_sequence_generating(default_model, tmp_path):
    # Two prompts a step (-b 32): the first two requests end (2 tokens) before the last ones read
    # their prompts, so no step has all eight generating and there is no steady figure.
    out = tmp_path / "b.json"
    proc = run_pshard("bench", "--batch", "-m", default_model, "-npp", "16", "-ntg", "2", "-npl", "8", "-b", "32", "-t",
                      "2", "-q", "--json", str(out))
    row = json.loads(out.read_text().splitlines()[0])
    assert row["steady_gen_tps"] == 0 and row["gen_tps"] > 0, row
    header, line = proc.stdout.splitlines()[-2:]
    assert header.split()[8:10] == ["steady", "t/s"] and line.split()[6] == "-", proc.stdout
