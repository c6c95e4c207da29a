"""bench/oracle_replay.py, which scores the planner against saved oracle runs without a GPU: it
reproduces a run's choice from `pshard plan` and the run's profile, counts a choice that was the
measured best, and with --latest counts a configuration measured in several runs once, at the run
given last. The oracle runs here are made up from the plan's own predictions, so what the replay
must say is known."""
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

from conftest import BUILD, load_bench

HERE = os.path.dirname(__file__)
REPLAY = os.path.join(HERE, "..", "..", "bench", "oracle_replay.py")
PROFILE = os.path.join(HERE, "..", "data", "profile", "h200-qwen30b.json")


@pytest.fixture(autouse=True)
def replay_scratch(monkeypatch, tmp_path_factory):
    """The replay writes its profile copies with tempfile, in the replay run here (TMPDIR) and in
    its functions called here (tempfile.tempdir): they go to a folder removed after each test,
    not to /tmp."""
    tmp_path_factory.getbasetemp()  # pytest's own folder, placed before tempfile's is moved
    with tempfile.TemporaryDirectory(prefix="oracle-replay-test-") as scratch:
        monkeypatch.setenv("TMPDIR", scratch)
        monkeypatch.setattr(tempfile, "tempdir", scratch)
        yield


def load_replay():
    return load_bench("oracle_replay")


def oracle_row(table, n, slow_choice):
    """One configuration's line as `pshard bench --oracle --json` writes it: the plan's choice measured
    at its prediction and the others at theirs or 10% over the choice, whichever is longer; or, with
    slow_choice, the choice 20% over the slowest of the others (so another is the measured best)."""
    chosen = next(name for name, cells in table.items() if cells[n][1])
    floor = table[chosen][n][0] * 1.1
    others = max(max(cells[n][0], floor) for name, cells in table.items() if name != chosen)
    candidates = []
    for name, cells in table.items():
        predicted = cells[n][0]
        if name == chosen:
            measured = others * 1.2 if slow_choice else predicted
        else:
            measured = max(predicted, floor)
        candidates.append({"plan": name, "measured_s": measured, "predicted_s": predicted, "cut": False,
                           "skipped": False, "rechecked": False})
    return {"model": "qwen30b.gguf", "budget_gb": 2, "context": 1024, "tokens": n, "chosen": chosen,
            "best": chosen, "candidates": candidates}


def replay(tmp_path, *args):
    """(configurations, the choice the best in, the worst slowdown in %) of a replay's summary."""
    configs, best, _, worst = summary(tmp_path, *args)
    return configs, best, worst


def summary(tmp_path, *args):
    """The replay's summary line: configurations, the choice the best in, within 2, 5 and 10% in,
    and the worst slowdown in %."""
    proc = subprocess.run([sys.executable, REPLAY, *args[:-1], os.path.join(BUILD, "pshard"), PROFILE, str(tmp_path),
                           *args[-1]], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    m = re.search(r"^(\d+) configurations: the choice was the measured best in (\d+) \(\d+%\), within 2% in (\d+), "
                  r"5% in (\d+), 10% in (\d+); at worst ([\d.]+)% slower", proc.stdout, re.M)
    assert m, proc.stdout
    configs, best, *within = (int(g) for g in m.groups()[:5])
    assert best <= within[0] <= within[1] <= within[2] <= configs, proc.stdout
    return configs, best, within, float(m.group(6))


def header_only_qwen30b(tmp_path):
    """qwen30b's shape without its weights, in tmp_path (the replay's model folder)."""
    model = tmp_path / "qwen30b.gguf"
    synth = subprocess.run([os.path.join(BUILD, "gguf-synth"), "--shape", "qwen30b", "--header-only", "--quiet", "-o",
                            str(model)], capture_output=True, text=True)
    assert synth.returncode == 0, synth.stderr
    return model


def test_replay_scores_runs_and_keeps_the_latest(tmp_path):
    model = header_only_qwen30b(tmp_path)
    table = load_replay().plan_table(os.path.join(BUILD, "pshard"), PROFILE, str(model), 2, 1024, 1024, [1, 4])
    assert len(table) >= 5 and all(sum(cells[n][1] for cells in table.values()) == 1 for n in (1, 4)), table

    hit, miss = tmp_path / "hit.json", tmp_path / "miss.json"
    hit.write_text("".join(json.dumps(oracle_row(table, n, False)) + "\n" for n in (1, 4)))
    miss.write_text(json.dumps(oracle_row(table, 1, True)) + "\n")  # the 1-token step again, the choice slow

    assert replay(tmp_path, [str(hit)]) == (2, 2, 0.0)
    configs, best, within, worst = summary(tmp_path, [str(hit), str(miss)])
    assert (configs, best, within) == (3, 2, [2, 2, 2]) and worst >= 19.9  # every measurement counts
    configs, best, worst = replay(tmp_path, "--latest", [str(hit), str(miss)])
    assert (configs, best) == (2, 1) and worst >= 19.9  # the 1-token step at its later, slow measurement
    assert replay(tmp_path, "--latest", [str(miss), str(hit)]) == (2, 2, 0.0)  # given last: the hit


def test_replay_takes_the_profile_written_beside_a_run(tmp_path):
    """`pshard bench --oracle --json X.json` writes X.profile.json; the replay plans X's rows with it
    rather than with the profile on its command line."""
    model = header_only_qwen30b(tmp_path)
    table = load_replay().plan_table(os.path.join(BUILD, "pshard"), PROFILE, str(model), 2, 1024, 1024, [1])
    run = tmp_path / "run.json"
    run.write_text(json.dumps(oracle_row(table, 1, False)) + "\n")
    beside = tmp_path / "run.profile.json"
    beside.write_text(open(PROFILE).read())
    assert replay(tmp_path, [str(run)]) == (1, 1, 0.0)
    beside.write_text("{ not a profile")  # read: the replay stops on it, naming it
    proc = subprocess.run([sys.executable, REPLAY, os.path.join(BUILD, "pshard"), PROFILE, str(tmp_path), str(run)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "run.profile.json" in proc.stderr, proc.stderr
    beside.unlink()  # none beside: the command line's
    assert replay(tmp_path, [str(run)]) == (1, 1, 0.0)


def test_anchor_scales_the_cpu_rates_to_the_host_speed_recorded(tmp_path):
    """--anchor replays a row that recorded the host's read speed with the profile's CPU rates
    scaled by how much slower the host read than when profiled; a row without it, or at the
    profile's speed, keeps the profile."""
    replay = load_replay()
    profile = json.load(open(PROFILE))
    row = {"model": "qwen30b.gguf", "tokens": 1}
    assert replay.anchored(PROFILE, row) == PROFILE
    assert replay.anchored(PROFILE, dict(row, host_read_gbps=[profile["host_read_gbps"]] * 2)) == PROFILE
    half = profile["host_read_gbps"] / 2
    slow = json.load(open(replay.anchored(PROFILE, dict(row, host_read_gbps=[half * 0.9, half * 1.1]))))
    assert abs(slow["host_read_gbps"] - half) < 0.01 * half
    for table in ("cpu_matmul", "cpu_experts"):
        for fmt, values in profile[table].items():
            assert all(abs(s / v - 2) < 0.02 for s, v in zip(slow[table][fmt], values) if v)
    assert all(abs(s / v - 2) < 0.02 for s, v in zip(slow["cpu_attn"], profile["cpu_attn"]) if v)
    assert slow["gpu_experts"] == profile["gpu_experts"] and slow["h2d_gbps"] == profile["h2d_gbps"]


def test_rows_are_replayed_with_the_cpu_figures_timed_before_them(tmp_path):
    """A row whose plans were weighed with the CPU's figures timed again before its configuration
    (cpu_now) is replayed with the profile those make: its host reads and CPU tables replaced format
    by format, the rest as profiled. A row weighed with the profile keeps it, as does one without
    the figures; --as-profiled (False) and --cpu-now (True) choose either way where there are
    figures. The replay's predictions follow them."""
    replay = load_replay()
    profile = json.load(open(PROFILE))
    row = {"model": "qwen30b.gguf", "tokens": 1}
    assert replay.weighed_with(PROFILE, row) == PROFILE
    assert replay.weighed_with(PROFILE, row, True) == PROFILE
    fmt = next(iter(profile["cpu_experts"]))
    slow = [v * 3 for v in profile["cpu_experts"][fmt]]
    now = {"host_read_gbps": 12.5, "cpu_matmul": {}, "cpu_experts": {fmt: slow}}
    path = replay.weighed_with(PROFILE, dict(row, cpu_now=now))  # no weighed_with: start BD's rows, weighed so
    assert path != PROFILE and replay.weighed_with(PROFILE, dict(row, cpu_now=now)) == path  # written once
    assert replay.weighed_with(PROFILE, dict(row, cpu_now=now, weighed_with="cpu_now")) == path
    assert replay.weighed_with(PROFILE, dict(row, cpu_now=now), False) == PROFILE
    as_run = dict(row, cpu_now=now, weighed_with="profile")
    assert replay.weighed_with(PROFILE, as_run) == PROFILE and replay.weighed_with(PROFILE, as_run, True) == path
    weighed = json.load(open(path))
    assert weighed["host_read_gbps"] == 12.5 and weighed["cpu_experts"][fmt] == slow
    assert weighed["cpu_matmul"] == profile["cpu_matmul"] and weighed["gpu_experts"] == profile["gpu_experts"]

    # The CPU's experts three times slower: the profile's choice at 2 GB (which computes some of
    # them on the CPU) is predicted slower.
    model = header_only_qwen30b(tmp_path)
    pshard = os.path.join(BUILD, "pshard")
    as_cached = replay.plan_table(pshard, PROFILE, str(model), 2, 1024, 1024, [1])
    as_now = replay.plan_table(pshard, path, str(model), 2, 1024, 1024, [1])
    chosen = lambda table: next(name for name, cells in table.items() if cells[1][1])
    assert as_now[chosen(as_cached)][1][0] > as_cached[chosen(as_cached)][1][0]


def test_noise_pairs_split_loads_from_rounds():
    """A load that runs slow at every step size pairs with itself across step sizes; plans of one
    round pair at each step size; and the correlations say which kind of stray the loads share."""
    replay = load_replay()
    # Two plans, three loads each, at 1 and 16 tokens: each load strays alike at both step sizes,
    # and the two plans' loads of one round stray in opposite ways.
    strays = [0.05, -0.03, 0.0]
    deviations = {("p", "m", 4, 1024): {}}
    for plan, sign in (("a", 1), ("b", -1)):
        for i, d in enumerate(strays):
            deviations[("p", "m", 4, 1024)][(plan, i)] = {1: sign * d, 16: sign * d}
    same_load, same_round = replay.noise_pairs(deviations)
    assert len(same_load) == 6 and len(same_round) == 6
    assert abs(replay.correlation(same_load) - 1) < 1e-9
    assert abs(replay.correlation(same_round) + 1) < 1e-9
    assert replay.correlation([(0.0, 1.0), (0.0, 2.0)]) == 0.0  # no spread: no correlation claimed


def test_workload_report_weighs_the_shared_set_over_a_request(capsys):
    """The set the choices share is scored over a request (a prompt in steps of the largest size
    timed, then 128 one-token steps), each set taking its best plan at each size and the CPU alone
    in reach of both: a set slower per token but far faster through the prompt is the right one,
    and one that loses the request is named with how much slower it was."""
    replay = load_replay()
    ring, no_ring = "dynamic balanced", "dynamic balanced (no ring)"
    # Context 1024: a 512-token prompt in two 256-token steps, then 128 tokens.
    prompt_heavy = {1: ({ring: 0.0101, no_ring: 0.0100, "cpu": 0.03}, ring),
                    256: ({ring: 0.5, no_ring: 1.5, "cpu": 3.0}, ring)}
    # Here the ring's set saves 0.4 s on the prompt and loses 128 * 0.005 s on the tokens.
    token_heavy = {1: ({ring: 0.025, no_ring: 0.020, "cpu": 0.03}, ring),
                   256: ({ring: 0.8, no_ring: 1.0, "cpu": 3.0}, ring)}
    # The CPU alone, faster than either at one token, serves both sets' requests alike.
    cpu_wins = {1: ({ring: 0.04, no_ring: 0.04, "cpu": 0.01}, "cpu"),
                256: ({ring: 0.8, no_ring: 1.2, "cpu": 4.0}, ring)}
    # Steps of at most 64 tokens say too little of how a prompt runs: left out.
    short = {1: ({ring: 0.02, no_ring: 0.01}, ring), 64: ({ring: 0.1, no_ring: 0.2}, ring)}
    replay.workload_report({("p", (), "m", 2, 1024): prompt_heavy, ("p", (), "m", 4, 1024): token_heavy,
                            ("p", (), "m", 8, 1024): cpu_wins, ("p", (), "m", 16, 1024): short})
    out = capsys.readouterr().out
    slower = (2 * 0.8 + 128 * 0.025) / (2 * 1.0 + 128 * 0.020) - 1
    assert re.search(r"\b4G\s+1024  the set chosen \(the ring's\) was %.1f%% slower" % (100 * slower), out), out
    assert "2G" not in out and "8G" not in out and "16G" not in out, out
    assert "the measured fastest in 2 of 3; at worst %.1f%% slower" % (100 * slower) in out, out


def test_a_miss_over_the_chosen_set_its_loads_cannot_rank(tmp_path):
    """Against the candidates over the choice's resident set, a miss whose loads overlap the best's
    (one more load could rank them the other way) is counted apart from one whose loads do not."""
    replay = load_replay()
    model = header_only_qwen30b(tmp_path)
    table = replay.plan_table(os.path.join(BUILD, "pshard"), PROFILE, str(model), 2, 1024, 1024, [1, 4])
    rows = []
    for n, overlap in ((1, True), (4, False)):
        row = oracle_row(table, n, False)
        chosen = row["chosen"]
        cells = [cells[n][0] for cells in table.values()]
        rival = next(c for c in row["candidates"] if c["plan"] != chosen and c["plan"] != "cpu"
                     and replay.resident_set(c["plan"]) == replay.resident_set(chosen)
                     and cells.count(table[c["plan"]][n][0]) == 1)
        mine = next(c for c in row["candidates"] if c["plan"] == chosen)
        t = mine["measured_s"]
        mine["loads"] = [0.97 * t, t, 1.03 * t] if overlap else [t, 1.01 * t, 1.02 * t]
        rival["loads"] = [0.96 * t, 0.98 * t, 0.98 * t]  # its slowest beats the choice's fastest only without overlap
        rival["measured_s"] = 0.98 * t
        mine["rechecked"] = rival["rechecked"] = True
        rows.append(row)
    run = tmp_path / "run.json"
    run.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([sys.executable, REPLAY, os.path.join(BUILD, "pshard"), PROFILE, str(tmp_path), str(run)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "over the resident set the choice runs over (a phase's tiers share one): the measured best in 0 " in proc.stdout
    assert ("of the 2 where it was not, 1 were timed over several loads with the choice's fastest load faster than the "
            "best's slowest (the best there, or not told from it by its loads, in 1)") in proc.stdout, proc.stdout
    assert replay.loads_overlap({1.0: [1, 2], 2.0: [2.5, 3]}, 2.0, 1.0) is False
    assert replay.loads_overlap({1.0: [1, 2], 2.0: [1.5, 3]}, 2.0, 1.0) is True
    assert replay.loads_overlap({1.0: [1, 2]}, 1.0, 2.0) is False  # one not timed over loads
