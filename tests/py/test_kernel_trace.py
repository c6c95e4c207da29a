"""bench/kernel_trace.py's reading of the CUPTI library's timeline (the tracing itself needs a GPU):
the GPU's idle time as what no record covers, overlapping records counted once, windows cut at
their edges, per-step figures, and clear errors for files that are not a trace."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import BENCH, load_bench

TOOL = os.path.join(BENCH, "kernel_trace.py")
kt = load_bench("kernel_trace")

HEAD = "kind,start_ns,end_ns,stream,grid,block,bytes,copy,name"


def trace(tmp_path, rows):
    path = tmp_path / "trace.csv"
    path.write_text("\n".join([HEAD] + rows) + "\n")
    return str(path)


def two_steps():
    ms = 1_000_000
    return [
        'kernel,%d,%d,7,1x1x1,32x1x1,0,,"void embed_rows(int)"' % (1 * ms, 3 * ms),
        'kernel,%d,%d,7,4x1x1,128x1x1,0,,"void mv_kernel<q4, 1>(mv_args)"' % (3.5 * ms, 5.5 * ms),
        'memcpy,%d,%d,8,,,4000000,DtoH,"memcpy"' % (5 * ms, 6 * ms),  # overlaps the kernel by 0.5 ms
        'kernel,%d,%d,7,1x1x1,32x1x1,0,,"void embed_rows(int)"' % (7 * ms, 9 * ms),
        'kernel,%d,%d,7,4x1x1,128x1x1,0,,"void mv_kernel<q4, 1>(mv_args)"' % (9 * ms, 10 * ms),
    ]


def test_idle_time_counts_overlaps_once(tmp_path):
    with open(trace(tmp_path, two_steps())) as f:
        records = kt.parse(f)
    t0, t1 = kt.window(records)
    rows, idle_ms, steps = kt.summarize(records, t0, t1, steps="embed_rows")
    assert steps == 2
    assert idle_ms == pytest.approx(1.5)  # 3-3.5 and 6-7 ms: the copy's overlap is not idle twice
    by = {r["label"]: r for r in rows}
    assert by["mv_kernel<q4, 1>"]["calls"] == 2 and by["mv_kernel<q4, 1>"]["total_ms"] == pytest.approx(3.0)
    assert by["mv_kernel<q4, 1>"]["median_us"] == pytest.approx(1500.0)
    assert by["memcpy DtoH"]["mb"] == pytest.approx(4.0)
    assert rows[0]["label"] == "embed_rows"  # largest total first


def test_window_cuts_records_at_its_edges(tmp_path):
    with open(trace(tmp_path, two_steps())) as f:
        records = kt.parse(f)
    t0, t1 = kt.window(records, last_ms=3.5)  # 6.5 - 10 ms: the second step and 0.5 ms before it
    rows, idle_ms, _ = kt.summarize(records, t0, t1)
    assert idle_ms == pytest.approx(0.5)
    assert {r["label"] for r in rows} == {"embed_rows", "mv_kernel<q4, 1>"}
    t0, t1 = kt.window(records, from_ms=4.0, to_ms=5.0)  # inside the first mv_kernel and the copy
    rows, idle_ms, _ = kt.summarize(records, t0, t1)
    assert idle_ms == pytest.approx(0.0)
    assert sum(r["total_ms"] for r in rows) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        kt.window(records, from_ms=5.0, to_ms=5.0)


def test_phases_show_where_the_gpu_worked(tmp_path):
    with open(trace(tmp_path, two_steps())) as f:
        parts = kt.phases(kt.parse(f), parts=9)  # 1 ms each from 1 ms
    busy = [round(b, 3) for _, _, b in parts]
    assert busy == [1.0, 1.0, 0.5, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]


@pytest.mark.skipif(not shutil.which("c++filt"), reason="c++filt (binutils) is not installed")
def test_kernel_names_are_demangled(tmp_path):
    rows = ['kernel,1000,2000,7,24x128x1,128x1x1,0,,"_Z15mv_group_kernelI9mv_legacyI11q4_0_unpackEEv7mv_args"',
            'kernel,3000,4000,7,1x1x1,32x1x1,0,,"plain_c_kernel"']
    out = subprocess.run([sys.executable, TOOL, "summarize", trace(tmp_path, rows)], capture_output=True, text=True,
                         check=True).stdout
    assert "| mv_group_kernel<mv_legacy<q4_0_unpack> > | 24x128x1 | 1 |" in out
    assert "| plain_c_kernel | 1x1x1 | 1 |" in out


def test_report_through_the_command_line(tmp_path):
    path = trace(tmp_path, two_steps())
    out = subprocess.run([sys.executable, TOOL, "summarize", path, "--steps", "embed_rows"],
                         capture_output=True, text=True, check=True).stdout
    assert "2 steps" in out and "a step: 4.500 ms" in out
    assert "| **GPU idle** | | | | 1.500 | 16.7% | 0.750 |" in out


def test_each_step_has_its_longest_gap(tmp_path):
    with open(trace(tmp_path, two_steps())) as f:
        records = kt.parse(f)
    t0, t1 = kt.window(records)
    rows = kt.each_step(records, t0, t1, "embed_rows")
    assert len(rows) == 1  # two calls of the step's kernel: one whole step between them
    r = rows[0]
    assert r["ms"] == pytest.approx(6.0) and r["idle_ms"] == pytest.approx(1.5)
    assert r["gap_ms"] == pytest.approx(1.0) and r["gap_after"] == "memcpy DtoH"  # 6-7 ms, after the copy
    assert r["top"] == "embed_rows" and r["top_ms"] == pytest.approx(2.0)  # (2 ms each: the first of a tie)
    out = subprocess.run([sys.executable, TOOL, "summarize", trace(tmp_path, two_steps()), "--steps", "embed_rows",
                          "--each-step"], capture_output=True, text=True, check=True).stdout
    assert "| 0.0 | 6.000 | 1.500 | 1.000 | memcpy DtoH | embed_rows | 2.000 |" in out
    bad = subprocess.run([sys.executable, TOOL, "summarize", trace(tmp_path, two_steps()), "--each-step"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--each-step needs --steps" in bad.stderr


@pytest.mark.parametrize("body, message", [
    (["kind,start,end"], "not a kernel_trace CSV"),
    ([HEAD, 'kernel,5,4,7,1x1x1,32x1x1,0,,"k"'], "ends before it starts"),
    ([HEAD, 'kernel,x,4,7,1x1x1,32x1x1,0,,"k"'], "whole numbers"),
    ([HEAD, 'kernel,1,4,7'], "fields"),
    ([HEAD], "no record"),
])
def test_bad_traces_are_refused_clearly(tmp_path, body, message):
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(body) + "\n")
    r = subprocess.run([sys.executable, TOOL, "summarize", str(path)], capture_output=True, text=True)
    assert r.returncode != 0 and message in r.stderr
    assert "Traceback" not in r.stderr


def test_run_without_the_library_says_so(tmp_path):
    r = subprocess.run([sys.executable, TOOL, "run", "--lib", str(tmp_path / "none.so"), "--", "true"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "no library" in r.stderr
