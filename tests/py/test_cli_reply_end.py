"""How a reply of `pshard run` ends, as a user reads it: the weights read per token count the steps
that ran, the one that gave the end of text included."""
import os
import re
import subprocess

from conftest import BUILD


def run(default_model, *args):
    proc = subprocess.run([os.path.join(BUILD, "pshard"), "run", "-m", default_model, "-t", "2", "--temp", "0", *args],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr.decode("utf-8")


def test_weights_read_per_token_count_the_steps_run(default_model):
    """On the CPU every step reads every weight: a reply ended by the model reads as much per token
    as one cut by -n (it ran one step more than it printed tokens, and that step counts)."""
    per_token = re.compile(r"^decode: (\d+) tokens at [\d.]+ tok/s; ([\d.]+ [KMG]?B) of weights read per token", re.M)
    _, err = run(default_model, "-p", "Say hi", "-n", "200")
    ended = per_token.search(err)
    assert ended and int(ended.group(1)) < 200, err
    _, err = run(default_model, "-p", "Say hi", "-n", "5", "--ignore-eos")
    cut = per_token.search(err)
    assert cut, err
    assert ended.group(2) == cut.group(2), (ended.group(0), cut.group(0))
