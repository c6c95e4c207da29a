"""bench/budget_rates.py's arithmetic (the serving and the budget changes need a GPU): the changes
as given, each segment's rate from its settled start to the next change, and a run started at a
budget counted over the same tokens."""
import pytest

from conftest import load_bench

rates = load_bench("budget_rates")


def test_changes_parse_in_order():
    assert rates.parse_changes(["8G", "2G@8", "6G@16.5"]) == [(0.0, "8G"), (8.0, "2G"), (16.5, "6G")]
    for bad in (["8G@1"], ["8G", "2G"], ["8G", "2G@8", "6G@8"], ["8G", "@3"]):
        with pytest.raises(ValueError):
            rates.parse_changes(bad)


def stream(segments):
    """Chunk times: (seconds, tokens/s) pieces, one after another."""
    times, t = [], 0.0
    for seconds, rate in segments:
        n = int(round(seconds * rate))
        times += [t + (k + 1) / rate for k in range(n)]
        t += seconds
    return times


def test_segment_rates_leave_out_the_settling():
    # 10 tok/s for 8 s, then 1 s at 2 tok/s (the change), 7 s at 5, then 3 s at 2 and 5 s at 8
    times = stream([(8, 10), (1, 2), (7, 5), (3, 2), (5, 8)])
    rows = rates.segment_rates(times, [(0.0, "8G"), (8.0, "2G"), (16.0, "6G")], settle=1.0)
    assert [r["budget"] for r in rows] == ["8G", "2G", "6G"]
    assert rows[0]["rate"] == pytest.approx(10, rel=1e-6)
    assert rows[1]["rate"] == pytest.approx(5, rel=1e-6)  # the second at 2 tok/s left out
    # the 6G segment counts from 17 s: 2 s at 2 tok/s then 5 s at 8
    assert rows[2]["rate"] == pytest.approx((len([t for t in times if t >= 17]) - 1) /
                                            (times[-1] - min(t for t in times if t >= 17)), rel=1e-9)
    # the tokens at 8 s (the change: the next segment's) and 8.5 s (settling) are in neither
    assert rows[0]["first"] == 0 and rows[1]["first"] == rows[0]["last"] + 3
    assert rows[2]["last"] == len(times) - 1
    # a segment too short for two tokens
    short = rates.segment_rates(times, [(0.0, "8G"), (8.0, "2G"), (8.2, "6G")], settle=0.0)
    assert short[1]["rate"] is None


def test_span_rate_over_the_same_tokens():
    alone = stream([(10, 4)])
    assert rates.span_rate(alone, 4, 20) == pytest.approx(4, rel=1e-9)
    assert rates.span_rate(alone, 4, 400) is None and rates.span_rate(alone, None, 3) is None
    assert rates.span_rate(alone, 5, 5) is None
