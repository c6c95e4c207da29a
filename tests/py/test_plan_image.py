"""`pshard plan --mmproj --image-size WxH` on gguf-synth's tiny Qwen2.5-VL pair: after the plan, the
image's size after the model's resize, its patches and tokens, the vision encoder's predicted time
on the GPU and the CPU, its peak VRAM, where it runs under the plan (the GPU in the scratch the plan
lends between steps where that holds it, else in the whole budget with the language model's
resident weights going up again after, the CPU otherwise, as the engine chooses), and the first
token of a request with the image; and the options' errors. No GPU needed: plans are made without
one."""
import os
import re
import subprocess

import pytest

from conftest import BUILD
from vision_helpers import write_tiny_vlm

NUM = r"([0-9.e+-]+|inf)"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan-image")
    write_tiny_vlm(d)
    return d


def plan(files, *args, model=None):
    argv = [os.path.join(BUILD, "pshard"), "plan", "-m", model or str(files / "tiny-qwen25vl.gguf"), "--no-profile",
            *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def image_part(files, size, budget, *extra):
    """The lines after the plan, each wrapped line joined to the one it continues, as a dict of what
    they say."""
    proc = plan(files, "--mmproj", str(files / "tiny-qwen25vl-mmproj.gguf"), "--image-size", size, "--vram-budget",
                budget, *extra)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("image "))
    joined = []
    for line in lines[start:]:
        if line.startswith(("image ", "  ")) or not joined:
            joined.append(line.strip())
        else:
            joined[-1] += " " + line.strip()
    part = {"image": joined[0]}
    for line in joined[1:]:
        key, _, rest = line.partition(": ")
        part[key] = rest
    return part


def seconds(text):
    return float(re.match(NUM, text).group(1))


def test_prints_the_image_and_its_encoder(files):
    part = image_part(files, "640x480", "64M")
    assert part["image"] == "image 640x480: resized to 644x476, 46 x 34 patches (1564), 391 image tokens"
    gpu, cpu = seconds(part["encoder on the GPU"]), seconds(part["encoder on the CPU"])
    assert 0 < gpu < cpu  # the conservative defaults' GPU is faster than their CPU
    m = re.match(r"([0-9.]+) MB \(chunks of (\d+) patches, (\d) staging slots?\); the plan lends ([0-9.]+) MB",
                 part["encoder's peak VRAM"])
    assert m, part
    peak, lent = float(m.group(1)), float(m.group(4))
    assert 0 < peak <= lent
    assert part["runs on"].startswith("the GPU, in the scratch lent between steps")
    m = re.match(NUM + r" s for a request with this image and a 32-token question \(encoding " + NUM +
                 r" s \+ a 425-token prompt " + NUM + r" s\)", part["first token"])
    assert m, part
    first, encoding, prompt = (float(x) for x in m.groups())
    assert encoding == pytest.approx(gpu, rel=1e-3)
    assert first == pytest.approx(encoding + prompt, rel=1e-3)


def test_times_grow_with_the_image(files):
    last = (0, 0)
    for size in ("56x56", "224x224", "640x480", "1920x1080"):
        part = image_part(files, size, "512M")
        now = (seconds(part["encoder on the GPU"]), seconds(part["encoder on the CPU"]))
        assert now[0] > last[0] and now[1] > last[1], (size, now, last)
        last = now


def test_placement_follows_the_room_the_plan_lends(files):
    # A budget that holds the model with room to spare: the GPU.
    roomy = image_part(files, "1920x1080", "512M")
    assert roomy["runs on"].startswith("the GPU"), roomy
    # One a little over the model's least: the plan lends less than the encoder needs at the least.
    tight = image_part(files, "1920x1080", "48M")
    assert tight["runs on"].startswith("the CPU (the vision encoder needs"), tight
    m = re.match(r"at least ([0-9.]+) MB \(chunks of 64 patches, 1 staging slot\); the plan lends ([0-9.]+) MB",
                 tight["encoder's peak VRAM"])
    assert m and float(m.group(1)) > float(m.group(2)), tight
    assert "(encoding " + tight["encoder on the CPU"].split()[0] + " s" in tight["first token"]
    # The CPU alone lends nothing; --no-mmproj-offload asks for the CPU's encoder, its first token
    # counting the CPU's encoding, whatever room the plan lends.
    cpu = image_part(files, "640x480", "0")
    assert cpu["runs on"].startswith("the CPU (the plan keeps every shard on the CPU"), cpu
    for budget in ("512M", "64M"):
        off = image_part(files, "640x480", budget, "--no-mmproj-offload")
        assert off["runs on"] == "the CPU (--no-mmproj-offload asks for the CPU's encoder)", off
        assert "(encoding " + off["encoder on the CPU"].split()[0] + " s" in off["first token"], off
        on = image_part(files, "640x480", budget)
        assert on["runs on"].startswith("the GPU") and on["encoder on the CPU"] == off["encoder on the CPU"], on


def test_the_whole_budget_when_the_scratch_is_short(files):
    # 64M: the plan lends less than the 1920x1080 image's least, its whole budget holds the largest
    # layout; the first token counts the resident weights' re-upload after the encoding.
    part = image_part(files, "1920x1080", "64M")
    m = re.match(r"([0-9.]+) MB \(chunks of (\d+) patches, 2 staging slots\); the plan lends ([0-9.]+) MB between "
                 r"steps, its whole budget ([0-9.]+) MB$", part["encoder's peak VRAM"])
    assert m, part
    peak, lent, whole = float(m.group(1)), float(m.group(3)), float(m.group(4))
    assert lent < peak <= whole, part
    m = re.match(r"the GPU, in the whole budget: the language model's resident weights go up again after, ([0-9.]+) MB "
                 r"in " + NUM + r" s( \(judged by memory: .*\))?$", part["runs on"])
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, part
    encoding = float(re.search(r"\(encoding " + NUM + " s", part["first token"]).group(1))
    assert encoding == pytest.approx(seconds(part["encoder on the GPU"]) + float(m.group(2)), rel=1e-3), part
    # More budget: the scratch holds it, nothing goes up again.
    roomy = image_part(files, "1920x1080", "80M")
    assert roomy["runs on"].startswith("the GPU, in the scratch lent between steps"), roomy
    # Less: neither holds its least, and the CPU's reason names both.
    tight = image_part(files, "1920x1080", "48M")
    assert re.match(r"the CPU \(the vision encoder needs [0-9.]+ MB of VRAM for 10764 patches at the least and [0-9.]+ MB "
                    r"was lent to it \(the whole budget: [0-9.]+ MB\)\)$", tight["runs on"]), tight


def test_an_image_over_the_context(files):
    part = image_part(files, "1920x1080", "512M", "-c", "256")
    assert part["first token"].startswith("none; the image's 2691 tokens and a 32-token question do not fit the "
                                          "context (-c 256)"), part


@pytest.mark.parametrize("size", ["0x480", "640x0", "-5x10", "axb", "640", "640x", "x480", "640.5x480", "20000x100",
                                  "10000x10000", "640x480x2", " 640x480"])
def test_bad_sizes_name_the_option(files, size):
    proc = plan(files, "--mmproj", str(files / "tiny-qwen25vl-mmproj.gguf"), "--image-size", size, "--vram-budget",
                "64M")
    assert proc.returncode == 2, (size, proc.stdout)
    assert "--image-size" in proc.stderr, (size, proc.stderr)
    assert proc.stdout == ""


def test_option_errors(files, default_model):
    proc = plan(files, "--image-size", "640x480", "--vram-budget", "64M")
    assert proc.returncode == 2 and "--mmproj" in proc.stderr, proc.stderr
    proc = plan(files, "--mmproj", str(files / "tiny-qwen25vl-mmproj.gguf"), "--vram-budget", "64M")
    assert proc.returncode == 2 and "--image-size" in proc.stderr, proc.stderr
    # --no-mmproj-offload says where the encoder runs: without --mmproj there is none to price.
    proc = plan(files, "--no-mmproj-offload", "--vram-budget", "64M")
    assert proc.returncode == 2 and "--no-mmproj-offload" in proc.stderr and "--mmproj" in proc.stderr, proc.stderr
    assert proc.stdout == ""
    # An image the processor refuses (an aspect ratio over 200), after the plan.
    proc = plan(files, "--mmproj", str(files / "tiny-qwen25vl-mmproj.gguf"), "--image-size", "16000x50",
                "--vram-budget", "64M")
    assert proc.returncode == 1 and "--image-size 16000x50" in proc.stderr and "aspect ratio" in proc.stderr
    # Not an mmproj file; a model that takes no images.
    proc = plan(files, "--mmproj", str(files / "tiny-qwen25vl.gguf"), "--image-size", "640x480", "--vram-budget", "64M")
    assert proc.returncode == 1 and "not an mmproj file" in proc.stderr, proc.stderr
    proc = plan(files, "--mmproj", str(files / "tiny-qwen25vl-mmproj.gguf"), "--image-size", "640x480",
                "--vram-budget", "64M", model=default_model)
    assert proc.returncode == 1 and "takes no images" in proc.stderr, proc.stderr
