"""bench/kernel_profile.py's reading of Nsight Compute's CSV (the profiling itself needs a GPU):
launches grouped by kernel and grid with their medians, the units ncu scales its values to, the
profiled program's own lines among the rows, and a clear error where there is nothing to read."""
import os
import subprocess
import sys

import pytest

from conftest import BENCH, load_bench

TOOL = os.path.join(BENCH, "kernel_profile.py")
kp = load_bench("kernel_profile")

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def launch(lid, name, grid, us_value, us_unit, read_value=None, read_unit="Mbyte"):
    common = '"%d","1","pshard","127.0.0.1","%s","1","7","(128, 1, 1)","%s","0","9.0","Command line profiler metrics"' % (
        lid, name, grid)
    rows = ['%s,"gpu__time_duration.sum","%s","%s"' % (common, us_unit, us_value)]
    if read_value is not None:
        rows.append('%s,"dram__bytes_read.sum","%s","%s"' % (common, read_unit, read_value))
    return rows


def sample():
    attn = "void attn_decode_kernel<4, 4>(ad_args)"
    mv = "void mv_kernel<mv_legacy<q4_0_unpack>, 1>(mv_args)"
    lines = ["==PROF== Connected to process 1", '"a line of the program\'s own output, quoted"', HEAD]
    lines += launch(1, attn, "(64, 4, 1)", "7,940", "nsecond", "80", "Kbyte")
    lines += launch(2, mv, "(1280, 1, 1)", "6.62", "usecond", "5.9", "Mbyte")
    lines += launch(3, attn, "(64, 4, 1)", "8,100", "nsecond", "82", "Kbyte")
    lines += launch(4, mv, "(512, 1, 1)", "5.73", "usecond", "4.7", "Mbyte")
    lines += launch(5, attn, "(64, 4, 1)", "7,700", "nsecond", "81", "Kbyte")
    lines += launch(6, mv, "(37984, 1, 1)", "0.074", "msecond")  # the head: no bytes row
    lines.append("==PROF== Disconnected from process 1")
    return "\n".join(lines) + "\n"


def test_launches_grouped_by_kernel_and_grid_in_microseconds():
    k = kp.parse(sample())
    assert set(k) == {("void attn_decode_kernel<4, 4>(ad_args)", "(64, 4, 1)"),
                      ("void mv_kernel<mv_legacy<q4_0_unpack>, 1>(mv_args)", "(1280, 1, 1)"),
                      ("void mv_kernel<mv_legacy<q4_0_unpack>, 1>(mv_args)", "(512, 1, 1)"),
                      ("void mv_kernel<mv_legacy<q4_0_unpack>, 1>(mv_args)", "(37984, 1, 1)")}
    attn = k[("void attn_decode_kernel<4, 4>(ad_args)", "(64, 4, 1)")]
    assert [us for us, _ in attn] == pytest.approx([7.94, 8.1, 7.7])
    assert [b for _, b in attn] == pytest.approx([80e3, 82e3, 81e3])
    assert k[("void mv_kernel<mv_legacy<q4_0_unpack>, 1>(mv_args)", "(37984, 1, 1)")] == [(pytest.approx(74.0), None)]


def test_rows_by_total_with_medians_shares_and_rates():
    rows, total = kp.summarize(kp.parse(sample()))
    assert total == pytest.approx(7.94 + 8.1 + 7.7 + 6.62 + 5.73 + 74.0)
    assert [r["kernel"] for r in rows] == ["mv_kernel<mv_legacy<q4_0_unpack>, 1>", "attn_decode_kernel<4, 4>",
                                           "mv_kernel<mv_legacy<q4_0_unpack>, 1>", "mv_kernel<mv_legacy<q4_0_unpack>, 1>"]
    attn = rows[1]
    assert (attn["calls"], attn["median_us"], attn["read_mb"]) == (3, pytest.approx(7.94), pytest.approx(0.081))
    assert attn["total_ms"] == pytest.approx((7.94 + 8.1 + 7.7) / 1e3)
    assert attn["tb_s"] == pytest.approx(81e3 / 7.94e6)
    assert rows[0]["read_mb"] is None and rows[0]["tb_s"] is None
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    table = kp.markdown(rows, total)
    assert "| attn_decode_kernel<4, 4> | (64, 4, 1) | 3 | 7.94 | 0.024 |" in table
    assert table.splitlines()[-1].startswith("| **all** | | 6 |")


def test_names_lose_their_parameters_not_their_templates():
    assert kp.short_name("void moe_down_kernel<mv_legacy<q4_0_unpack>>(moe_fused_args)") == \
        "moe_down_kernel<mv_legacy<q4_0_unpack>>"
    assert kp.short_name("attn_combine_kernel(const float *, const float *, int)") == "attn_combine_kernel"
    assert kp.short_name("nvjet_sm90_hss_128x120_64x6_1x2_h_bz_TNT") == "nvjet_sm90_hss_128x120_64x6_1x2_h_bz_TNT"


def test_nothing_to_read_is_a_clear_error(tmp_path):
    for text in ["", "==PROF== no kernels were profiled\n", HEAD + "\n"]:
        with pytest.raises(ValueError):
            kp.parse(text)
    empty = tmp_path / "empty.csv"
    empty.write_text("==PROF== no kernels were profiled\n")
    p = subprocess.run([sys.executable, TOOL, "summarize", str(empty)], capture_output=True, text=True)
    assert p.returncode != 0 and "no CSV header" in p.stderr
    p = subprocess.run([sys.executable, TOOL, "summarize", str(tmp_path / "missing.csv")], capture_output=True, text=True)
    assert p.returncode != 0 and "missing.csv" in p.stderr
    p = subprocess.run([sys.executable, TOOL, "run", "--ncu", "/bin/true"], capture_output=True, text=True)
    assert p.returncode != 0 and "no command" in p.stderr


def test_summarize_prints_the_table(tmp_path):
    f = tmp_path / "step.csv"
    f.write_text(sample())
    p = subprocess.run([sys.executable, TOOL, "summarize", str(f)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0].startswith("| kernel | grid | calls | median µs |")
    assert "| mv_kernel<mv_legacy<q4_0_unpack>, 1> | (1280, 1, 1) | 1 | 6.62 |" in p.stdout


def test_run_calls_ncu_on_the_command_and_keeps_its_csv(tmp_path):
    """`run` with a stand-in for ncu that records its arguments and prints the sample."""
    data, argv_file, kept = tmp_path / "sample.csv", tmp_path / "argv.txt", tmp_path / "kept.csv"
    data.write_text(sample())
    fake = tmp_path / "ncu"
    fake.write_text("#!%s\nimport sys\nopen(%r, 'w').write('\\n'.join(sys.argv[1:]))\nprint(open(%r).read())\n"
                    % (sys.executable, str(argv_file), str(data)))
    fake.chmod(0o755)
    p = subprocess.run([sys.executable, TOOL, "run", "--ncu", str(fake), "--skip", "10", "--count", "20", "--csv",
                        str(kept), "--", "build/pshard", "run", "-m", "m.gguf"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    args = argv_file.read_text().split("\n")
    assert args[-4:] == ["build/pshard", "run", "-m", "m.gguf"]
    for flag, value in [("--launch-skip", "10"), ("--launch-count", "20"), ("--metrics", kp.METRICS),
                        ("--graph-profiling", "node"), ("--cache-control", "none"), ("--clock-control", "none")]:
        assert args[args.index(flag) + 1] == value
    assert "--csv" in args
    assert kept.read_text() == sample() + "\n"
    assert "| attn_decode_kernel<4, 4> | (64, 4, 1) | 3 |" in p.stdout
