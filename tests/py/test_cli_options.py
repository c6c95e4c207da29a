"""The options of every pshard subcommand as a newcomer tries them: numbers are read by one parser
(whole numbers are whole, NaN and infinities refused, sizes and lists strict, the message names the
option and the value and prints its range in whole numbers), -n 0 generates nothing, a context over the model's is capped with a
notice, --seed -1 draws a seed, --help goes to stdout, `pshard plan` needs its budget and says
once what to do where no GPU can be priced, and `pshard run` reports its load in parts."""
import json
import os
import re
import subprocess

import pytest

from conftest import BUILD

SAMPLING = ["--temp", "--top-p", "--min-p", "--repeat-penalty", "--presence-penalty", "--frequency-penalty"]
RUN_INTS = ["-n", "-c", "-b", "-t", "--top-k", "--repeat-last-n"]
# A subcommand (with the words that pick its mode) and the options it reads numbers from.
INTS = {
    ("run",): RUN_INTS,
    ("chat",): RUN_INTS,
    ("serve",): RUN_INTS + ["--port", "--parallel", "--max-queue", "--drain"],
    ("plan",): ["-n", "-c", "-b", "-t", "--parallel"],
    ("eval",): ["-c", "-b", "-t"],
    ("profile",): ["-t"],
    ("batch",): ["-n", "-c", "-t", "--parallel", "--stagger"],
    ("bench", "--batch"): ["-npp", "-ntg", "-b", "-t"],
    ("bench", "--oracle"): ["-b", "-t", "--reps", "--recheck"],
}
REALS = {
    ("run",): SAMPLING + ["--stream-share"],
    ("chat",): SAMPLING + ["--stream-share"],
    ("serve",): SAMPLING + ["--stream-share"],
    ("plan",): ["--stream-share"],
    ("eval",): ["--stream-share"],
    ("batch",): SAMPLING,
    ("bench", "--batch"): ["--stream-share"],
}
SIZES = {("run",): ["--vram-budget"], ("chat",): ["--vram-budget"], ("serve",): ["--vram-budget", "--max-body"],
         ("plan",): ["--vram-budget"], ("eval",): ["--vram-budget"], ("profile",): ["--vram-budget"],
         ("bench", "--batch"): ["--vram-budget"]}
# Comma-separated lists of whole numbers (or sizes: --budgets).
LISTS = {("plan",): ["--tokens"], ("bench", "--batch"): ["-npl"], ("bench", "--oracle"): ["--contexts", "--tiers",
         "--budgets"], ("eval",): ["--tokens", "--steps"]}
# What a command needs besides the option tried, so that only that option can be refused.
NEEDS = {("run",): ["-p", "x"], ("eval",): ["--tokens", "1,2", "-o", os.devnull]}


def pshard(*args, env=None, timeout=300):
    return subprocess.run([os.path.join(BUILD, "pshard"), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def refused(cmd, option, value):
    """The command given option=value (and what else it needs) stops at once, naming the option and
    the value, with ranges in whole numbers."""
    cmd = cmd if isinstance(cmd, tuple) else (cmd,)
    proc = pshard(*cmd, *NEEDS.get(cmd, []), option, value, timeout=30)  # (the last of an option counts)
    assert proc.returncode == 2, (cmd, option, value, proc.stderr)
    message = proc.stderr.splitlines()[0]
    assert message.startswith("pshard %s: %s " % (cmd[0], option)) and "'%s'" % value in message, (cmd, option, message)
    assert not re.search(r"\de[+-]?\d", message.split(", got")[0]), message  # whole numbers, not 1.67772e+07
    assert proc.stdout == ""
    return message


@pytest.mark.parametrize("cmd", sorted(set(INTS) | set(REALS) | set(SIZES) | set(LISTS)), ids=" ".join)
def test_numbers_are_checked_alike_by_every_subcommand(cmd):
    for option in INTS.get(cmd, []):
        for value in ("nan", "inf", "-inf", "2.5", "1e3", "0x10", " 7", ""):
            assert "takes a whole number from" in refused(cmd, option, value)
    for option in REALS.get(cmd, []):
        for value in ("nan", "NaN", "inf", "-infinity", "1,5", "x"):
            assert "takes a number in" in refused(cmd, option, value)
    for option in SIZES.get(cmd, []):
        for value in ("nan", "inf", "-1G", "2X", " 2G", "0x10", "1e3", "1.5"):
            refused(cmd, option, value)
    for option in LISTS.get(cmd, []):
        for value in ("nan", " 3", "3, 4", "1.5", "3,,4", "3,", "1e3", "0x10", ""):
            refused(cmd, option, value)
    if cmd in (("run",), ("chat",), ("serve",)):  # a budget that follows free memory keeps a size too
        for value in ("auto:keep=nan", "auto:keep= 2G", "auto:keep=1e3", "auto:keep=1.5", "auto:keep=", "autox"):
            assert "auto[:keep=SIZE]" in refused(cmd, "--vram-budget", value)
    if cmd in (("run",), ("chat",)):
        message = refused(cmd, "-c", "99999999")
        assert "from 1 to 16777216" in message, message
        for value in ("-2", "1.5", "nan"):
            assert "-1 for a random one" in refused(cmd, "--seed", value)


# The planning options' commands, with what each needs besides the option tried.
PLANNING = {"plan": ["plan"], "run": ["run", "-p", "x"], "eval": ["eval", "--tokens", "1,2", "-o", os.devnull],
            "bench --batch": ["bench", "--batch"]}


@pytest.mark.parametrize("option,value", [("--plan", "fastest"), ("--plan", None), ("--set", "all-kvs"), ("--set", None),
                                          ("--decode-set", "half"), ("--decode-set", None), ("--stream-share", "1.5"),
                                          ("--stream-share", "nan"), ("--stream-share", None), ("--vram-budget", "2Q"),
                                          ("--vram-budget", "-1G"), ("--vram-budget", None)])
def test_planning_options_are_read_alike(option, value):
    """--vram-budget, --plan, --stream-share, --set and --decode-set are read by one parser: a bad value,
    or none, gets the same message from plan, run, eval and bench --batch, but for the command's name
    (run's budget may follow free memory too, which its message for a bad size adds)."""
    said = {}
    for name, cmd in PLANNING.items():
        proc = pshard(*cmd, option, *([value] if value is not None else []), timeout=30)
        assert proc.returncode == 2 and proc.stdout == "", (name, proc)
        prefix = "pshard %s: " % cmd[0]
        line = proc.stderr.splitlines()[0]
        assert line.startswith(prefix + option), (name, line)
        said[name] = line[len(prefix):]
    run = said.pop("run")
    if option == "--vram-budget" and value is not None:
        assert run == said["plan"].replace(", got", ", or auto[:keep=SIZE], got"), run
    else:
        assert run == said["plan"], (run, said["plan"])
    assert len(set(said.values())) == 1, said


def test_n_0_generates_nothing(default_model):
    none = pshard("run", "-m", default_model, "-p", "Hello", "-t", "2", "-n", "0", "--ids")
    assert none.returncode == 0, none.stderr
    assert none.stdout == "ids:\n", none.stdout
    assert re.search(r"^prompt: \d+ tokens", none.stderr, re.M) and "decode:" not in none.stderr, none.stderr
    one = pshard("run", "-m", default_model, "-p", "Hello", "-t", "2", "-n", "1", "--ids", "--ignore-eos", "-q")
    assert one.returncode == 0 and len(one.stdout.splitlines()[-1].split()) == 2, one.stdout  # "ids: N"


LOAD = re.compile(r"^load: ([\d.]+) s \(reading the model ([\d.]+) s, planning ([\d.]+) s, touching its pages "
                  r"([\d.]+) s, the executor ([\d.]+) s(?:; the vision encoder ([\d.]+) s)?\)$", re.M)


def load_parts(stderr):
    """pshard run's load line: the whole and its parts in seconds (the vision encoder's None without
    one); the parts add up to the whole within their rounding."""
    m = LOAD.search(stderr)
    assert m, stderr
    whole, *parts = [float(v) if v is not None else None for v in m.groups()]
    shown = [v for v in parts if v is not None]
    assert abs(sum(shown) - whole) <= 0.005 * (len(shown) + 1), (whole, parts)
    return whole, parts


def test_the_load_is_reported_in_parts(default_model):
    proc = pshard("run", "-m", default_model, "-p", "Hello", "-t", "2", "-n", "1")
    assert proc.returncode == 0, proc.stderr
    whole, parts = load_parts(proc.stderr)
    assert parts[4] is None and whole > 0, parts
    # Without touching the pages first, that part is nothing; -q prints no load line.
    lazy = pshard("run", "-m", default_model, "-p", "Hello", "-t", "2", "-n", "1", "--no-prefault")
    assert lazy.returncode == 0 and load_parts(lazy.stderr)[1][2] == 0.0, lazy.stderr  # (touching its pages)
    quiet = pshard("run", "-m", default_model, "-p", "Hello", "-t", "2", "-n", "1", "-q")
    assert quiet.returncode == 0 and "load:" not in quiet.stderr, quiet.stderr


def test_context_over_the_models_is_capped_with_a_notice(default_model):
    proc = pshard("run", "-m", default_model, "-p", "Hello", "-t", "2", "-n", "1", "-q", "-c", "100000")
    assert proc.returncode == 0, proc.stderr
    assert "pshard run: -c 100000 is over the context the model was trained for; using 8192" in proc.stderr
    plan = pshard("plan", "-m", default_model, "--vram-budget", "0", "--no-profile", "-c", "100000")
    assert plan.returncode == 0 and "-c 100000 is over the context" in plan.stderr, plan.stderr
    assert "using 8192" in plan.stderr
    within = pshard("run", "-m", default_model, "-p", "Hello", "-t", "2", "-n", "1", "-q", "-c", "8192")
    assert within.returncode == 0 and "over the context" not in within.stderr, within.stderr
    assert "a larger one than the model was trained" in pshard("run", "--help").stdout
    # With many sequences, -c is the cells they share (4 x 4096 by default): not one context.
    batch = pshard("batch", "-m", default_model, "-p", "Hello", "-p", "Hi", "-t", "2", "-n", "1", "-q", "--parallel", "4")
    assert batch.returncode == 0 and "over the context" not in batch.stderr, batch.stderr


def test_a_random_seed(default_model):
    args = ["run", "-m", default_model, "-p", "Name a colour.", "-t", "2", "-n", "6", "--temp", "1.5"]
    drawn = pshard(*args, "--seed", "-1")
    assert drawn.returncode == 0, drawn.stderr
    seed = re.search(r"^seed: (\d+) \(drawn at random\)$", drawn.stderr, re.M)
    assert seed, drawn.stderr
    again = pshard(*args, "--seed", seed.group(1))
    assert again.returncode == 0 and again.stdout == drawn.stdout, (drawn.stdout, again.stdout)
    quiet = pshard(*args, "--seed", "-1", "-q")
    assert quiet.returncode == 0 and "seed" not in quiet.stderr, quiet.stderr


@pytest.mark.parametrize("cmd", ["run", "chat", "batch", "plan", "profile", "bench", "info", "tokenize", "eval"])
def test_help_goes_to_stdout(cmd):
    proc = pshard(cmd, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: pshard %s" % cmd) and proc.stderr == "", proc
    bad = pshard(cmd, "--no-such-option")
    assert bad.returncode == 2 and "usage:" in bad.stderr and bad.stdout == "", bad


# Options that take a text, a path or a list, given last: each says it needs a value.
VALUED = [("run", "-m"), ("run", "--prompt"), ("run", "--image"), ("run", "--mmproj"), ("run", "--budget-file"),
          ("run", "--system"), ("chat", "--model"), ("chat", "--mmproj"), ("batch", "-f"), ("batch", "-m"),
          ("plan", "-m"), ("plan", "--profile"), ("plan", "--image-size"), ("plan", "--tokens"), ("eval", "--tokens"),
          ("eval", "-o"), ("profile", "-m"), ("bench", "--batch", "-m"), ("bench", "--batch", "-npl"),
          ("info", "-m"), ("tokenize", "-p"), ("serve", "--api-key")]


@pytest.mark.parametrize("args", VALUED, ids=" ".join)
def test_an_option_given_last_needs_a_value(args):
    proc = pshard(*args)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert "%s needs a value" % args[-1] in proc.stderr and "unknown" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("cmd", ["run", "chat", "plan", "profile", "eval", "tokenize", "info"])
def test_an_unknown_option_is_named(cmd):
    proc = pshard(cmd, "--frobnicate", "3")
    assert proc.returncode == 2 and "unknown option '--frobnicate'" in proc.stderr, proc.stderr


def test_plan_needs_a_budget(default_model):
    proc = pshard("plan", "-m", default_model, "--no-profile")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert "--vram-budget SIZE is required" in proc.stderr and "0: the CPU alone" in proc.stderr, proc.stderr


def cpu_only_profile(model, directory):
    """A profile measured without a GPU (the H200's, its GPU taken away), for plans on a machine that
    has no CUDA device either; skips where one is here (its plans are priced)."""
    probe = pshard("plan", "-m", model, "--vram-budget", "2G", "--no-profile")
    if "has no CUDA device" not in probe.stderr:
        pytest.skip("a CUDA device is here: its plans are priced")
    profile = json.load(open(os.path.join(os.path.dirname(__file__), "..", "data", "profile", "h200-qwen30b.json")))
    profile["has_gpu"] = False
    cpu_only = directory / "cpu-only.json"
    cpu_only.write_text(json.dumps(profile))
    return str(cpu_only)


def test_plan_without_a_gpu_says_once_what_to_do(tmp_path):
    """A CPU-only profile on a machine without a CUDA device prices no GPU step (inf): one note says
    so and what the user can do instead; the profile line does not say it again."""
    model = str(synth_qwen30b(tmp_path))
    proc = pshard("plan", "-m", model, "--vram-budget", "2G", "--profile", cpu_only_profile(model, tmp_path))
    assert proc.returncode == 0, proc.stderr
    note = " ".join(proc.stderr.split())
    assert note.count("no CUDA device") == 1 and "not priced (inf)" in note, note
    for remedy in ("--vram-budget 0", "--profile FILE", "--no-profile"):
        assert remedy in note, (remedy, note)
    assert all(len(l) <= 100 for l in proc.stderr.splitlines()), proc.stderr
    assert "not priced" not in proc.stdout and "CUDA device" not in proc.stdout
    assert proc.stdout.startswith("profile: measured in") and ", without a GPU" in proc.stdout.splitlines()[0]


def test_plan_without_a_gpu_claims_no_placement(default_model, tmp_path):
    """A model that fits the budget whole is planned all in VRAM whatever the profile: the note on
    the unpriced steps says what it means and what to do, and nothing about where the plan runs."""
    proc = pshard("plan", "-m", default_model, "--vram-budget", "2G", "--profile", cpu_only_profile(default_model, tmp_path))
    assert proc.returncode == 0 and re.search(r"^plan gpu:", proc.stdout, re.M), proc.stdout
    note = " ".join(proc.stderr.split())
    assert note.count("not priced (inf)") == 1 and "--vram-budget 0" in note, note
    assert "CPU" not in note.split("`pshard run`")[0], note  # (the plan above is on the GPU)


def synth_qwen30b(directory):
    model = directory / "qwen30b.gguf"
    if not model.exists():
        synth = subprocess.run([os.path.join(BUILD, "gguf-synth"), "--shape", "qwen30b", "--header-only", "--quiet",
                                "-o", str(model)], capture_output=True, text=True)
        assert synth.returncode == 0, synth.stderr
    return model
