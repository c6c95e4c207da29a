"""bench/vision_plot.py reads bench/h200_vision.sh's table as bench/vision_parse.py writes its rows
(logs of both programs made up here) and compares pshard with each llama-mtmd-cli case at the same
budget and image size. The plot itself needs matplotlib, which the benchmark machine has and the
tests do not install: only the table and the comparison are checked here."""
import os
import subprocess
import sys

from conftest import BENCH, load_bench


PSHARD_LOG = """prompt: {prompt} tokens (0 reused) in {ttft} ms = 800.0 tok/s; TTFT {ttft} ms; 1 GB of weights over PCIe
images: 1 encoded in {image} ms (within the TTFT)
decode: 16 tokens at {decode} tok/s; 14.1 GB of weights read per token
"""
LLAMA_LOG = """mtmd batch encoding done in {image} ms
llama_perf_context_print: prompt eval time =   {prompt_ms} ms /  {prompt} tokens
llama_perf_context_print:        eval time =    1000.00 ms /    15 runs   (   66.67 ms per token, {decode} tokens per second)
"""


def row(tmp_path, name, image, log, wall, peak):
    path = tmp_path / ("%s_%s.log" % (name.replace(" ", "_").replace(",", ""), image))
    path.write_text(log)
    out = subprocess.run([sys.executable, os.path.join(BENCH, "vision_parse.py"), name, image, str(path), str(wall), str(peak)],
                         capture_output=True, text=True, check=True).stdout
    return out


def test_table_rows_and_the_comparison(tmp_path):
    lines = ["%-34s %-10s %9s %9s %9s %9s %9s %9s\n" % ("case", "image", "TTFT s", "image s", "prompt t", "decode t/s",
                                                        "wall s", "peak MiB")]
    lines.append(row(tmp_path, "pshard 2G", "2560x1440", PSHARD_LOG.format(prompt=4669, ttft=4160, image=3390, decode=8.2),
                     43.6, 3111))
    lines.append(row(tmp_path, "llama 2G, vision on CPU", "2560x1440",
                     LLAMA_LOG.format(image=9000, prompt_ms="6480.00", prompt=4669, decode="7.90"), 60.0, 2111))
    lines.append(row(tmp_path, "pshard 2G", "1280x720", PSHARD_LOG.format(prompt=1224, ttft=1230, image=530, decode=8.6),
                     35.4, 3111))
    lines.append(row(tmp_path, "llama 2G, vision on GPU", "1280x720",
                     LLAMA_LOG.format(image=350, prompt_ms="2110.00", prompt=1224, decode="8.10"), 39.2, 4249))
    lines.append(row(tmp_path, "pshard 8G", "1280x720", PSHARD_LOG.format(prompt=1224, ttft=600, image=300, decode=14.0),
                     20.0, 9200))
    lines.append("(llama 8G, vision on GPU failed: out of memory)\n")
    table = tmp_path / "vision.txt"
    table.write_text("".join(lines))
    plot = load_bench("vision_plot")
    rows = plot.read_table(str(table))
    assert [(r["program"], r["budget"], r["image"]) for r in rows] == [
        ("pshard", "2G", "2560x1440"), ("llama, vision on CPU", "2G", "2560x1440"), ("pshard", "2G", "1280x720"),
        ("llama, vision on GPU", "2G", "1280x720"), ("pshard", "8G", "1280x720")]
    assert rows[0]["ttft"] == 4.16 and rows[0]["image_s"] == 3.39 and rows[0]["prompt"] == 4669 and rows[0]["peak"] == 3111
    assert rows[1]["ttft"] == 15.48 and rows[1]["decode"] == 7.9  # encoding + prompt evaluation
    assert rows[2]["pixels"] == 1280 * 720
    compared = {(b, image, other): (ttft, wall) for b, image, other, ttft, wall in plot.compare(rows)}
    # only the same budget and size; pshard 8G has no llama row to meet
    assert set(compared) == {("2G", "2560x1440", "llama, vision on CPU"), ("2G", "1280x720", "llama, vision on GPU")}
    ttft, wall = compared[("2G", "2560x1440", "llama, vision on CPU")]
    assert abs(ttft - 15.48 / 4.16) < 1e-9 and abs(wall - 60.0 / 43.6) < 1e-9
    ttft, _ = compared[("2G", "1280x720", "llama, vision on GPU")]
    assert abs(ttft - 2.46 / 1.23) < 1e-9
    assert plot.mib("2G") == 2048 and plot.mib("512M") == 512


def test_a_table_without_rows_is_refused(tmp_path):
    table = tmp_path / "vision.txt"
    table.write_text("case       image   TTFT s\n")
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "vision_plot.py"), str(table), str(tmp_path / "v.png")],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "no rows" in proc.stderr
    assert not (tmp_path / "v.png").exists()
