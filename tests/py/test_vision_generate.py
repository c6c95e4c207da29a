"""Prompts with images on gguf-synth's tiny Qwen2.5-VL pair, against llama.cpp's multimodal
library (llama-cpp-python's mtmd bindings): the same greedy tokens for a text-only prompt and for
prompts with one and two images (M-RoPE positions, <|vision_start|> ... <|vision_end|>, the
encoder's embeddings in place of token rows). Random weights make near ties: tokens are compared
up to the first step whose top two logits in llama.cpp are closer than 0.01 (at least 4 tokens
each time). And the errors `pshard run` gives for images it cannot take."""
import ctypes
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import BUILD, run_pshard
from llama_cpp_plain import plain_cpu_kernels  # noqa: F401 (autouse: AMX kernels crash)
from vision_helpers import write_tiny_vlm

Image = pytest.importorskip("PIL.Image")
SYNTH = os.path.join(BUILD, "gguf-synth")
N = 12


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vlm")
    write_tiny_vlm(d)
    return d


def pshard_ids(files, prompt, images, encoder=False, extra=()):
    args = ["run", "-m", str(files / "tiny-qwen25vl.gguf"), "--raw", "--temp", "0", "-n", str(N), "--ids", "-q",
            "-t", "2", "-p", prompt, *extra]
    if images or encoder:
        args += ["--mmproj", str(files / "tiny-qwen25vl-mmproj.gguf")]
        for im in images:
            args += ["--image", str(files / im)]
    out = run_pshard(*args).stdout
    return [int(x) for x in re.search(r"^ids:(.*)$", out, re.M).group(1).split()]


def llama_cpp_ids(files, prompt, images):
    """Greedy tokens and each step's margin between the top two logits, from llama.cpp."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import llama_cpp.llama_cpp as low
    from llama_cpp import mtmd_cpp as mt

    model = llama_cpp.Llama(model_path=str(files / "tiny-qwen25vl.gguf"), n_ctx=512, n_batch=512, verbose=False,
                            n_threads=2)
    params = mt.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings = False, 2, False
    ctx = mt.mtmd_init_from_file(str(files / "tiny-qwen25vl-mmproj.gguf").encode(), model.model, params)
    assert ctx
    try:
        pixels = [np.ascontiguousarray(np.asarray(Image.open(files / im).convert("RGB"))) for im in images]
        bitmaps = [mt.mtmd_bitmap_init(p.shape[1], p.shape[0], p.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
                   for p in pixels]
        chunks = mt.mtmd_input_chunks_init()
        text = prompt.replace("<__image__>", "<__media__>").encode()
        t = mt.mtmd_input_text()
        t.text, t.text_len, t.add_special, t.parse_special = text, len(text), True, True
        array = (mt.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        assert mt.mtmd_tokenize(ctx, chunks, ctypes.byref(t), array, len(bitmaps)) == 0
        n_past = low.llama_pos(0)
        assert mt.mtmd_helper_eval_chunks(ctx, model.ctx, chunks, 0, 0, 512, True, ctypes.byref(n_past)) == 0
        ids, margins = [], []
        for _ in range(N):
            logits = np.ctypeslib.as_array(low.llama_get_logits_ith(model.ctx, -1), shape=(model.n_vocab(),))
            top = np.sort(logits)
            ids.append(int(logits.argmax()))
            margins.append(float(top[-1] - top[-2]))
            one = (low.llama_token * 1)(ids[-1])
            assert low.llama_decode(model.ctx, low.llama_batch_get_one(one, 1)) == 0
        mt.mtmd_input_chunks_free(chunks)
        for b in bitmaps:
            mt.mtmd_bitmap_free(b)
    finally:
        mt.mtmd_free(ctx)
    return ids, margins


@pytest.mark.parametrize("prompt,images", [
    ("The quick brown fox jumps over the lazy dog.", []),
    ("<__image__>Describe: ", ["a.png"]),
    # (its last word chosen where llama.cpp's top two logits stay 0.03 or more apart for all 12 steps
    # on an AVX2 machine, where "... and say" met a near tie, 0.0008, at its third step)
    ("Compare <__image__> with <__image__> and tell", ["a.png", "b.png"]),
])
def test_greedy_tokens_match_llama_cpp(files, prompt, images):
    ours = pshard_ids(files, prompt, images)
    theirs, margins = llama_cpp_ids(files, prompt, images)
    robust = next((i for i, m in enumerate(margins) if m < 0.01), N)
    assert robust >= 4, f"llama.cpp's step {robust} is a near tie; pick another case ({margins})"
    assert ours[:robust] == theirs[:robust], (ours, theirs, margins)


def test_text_alone_with_the_encoder_loaded(files):
    prompt = "The quick brown fox jumps over the lazy dog."
    assert pshard_ids(files, prompt, [], encoder=True) == pshard_ids(files, prompt, [])


def test_images_over_small_steps(files):
    """Steps of 5 tokens cut each image's run into pieces (and never hold two images' tokens):
    the same tokens as whole-image steps. A context too small for an image is a clear error."""
    prompt, images = "A <__image__> B <__image__> C", ["a.png", "b.png"]
    assert pshard_ids(files, prompt, images, extra=["-b", "5"]) == pshard_ids(files, prompt, images)
    proc = run_pshard("run", "-m", str(files / "tiny-qwen25vl.gguf"), "--mmproj", str(files / "tiny-qwen25vl-mmproj.gguf"),
                      "--image", str(files / "a.png"), "-c", "60", "-p", "x", check=False)
    assert proc.returncode == 1 and "77 tokens" in proc.stderr and "-c" in proc.stderr


def test_the_image_matters(files):
    """The same prompt with another image gives other tokens (the embeddings reach the model)."""
    assert pshard_ids(files, "<__image__>Describe: ", ["a.png"]) != pshard_ids(files, "<__image__>Describe: ", ["b.png"])


def test_clear_errors(files, tmp_path):
    lm, mmproj = str(files / "tiny-qwen25vl.gguf"), str(files / "tiny-qwen25vl-mmproj.gguf")
    proc = run_pshard("run", "-m", lm, "--image", str(files / "a.png"), "-p", "x", check=False)
    assert proc.returncode == 2 and "--mmproj" in proc.stderr
    proc = run_pshard("run", "-m", lm, "--mmproj", mmproj, "--image", str(tmp_path / "none.png"), "-p", "x", check=False)
    assert proc.returncode == 1 and "none.png" in proc.stderr and "cannot open" in proc.stderr
    Image.new("RGB", (16385, 1)).save(tmp_path / "wide.png")
    proc = run_pshard("run", "-m", lm, "--mmproj", mmproj, "--image", str(tmp_path / "wide.png"), "-p", "x", check=False)
    assert proc.returncode == 1 and "16384" in proc.stderr
    (tmp_path / "junk.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    proc = run_pshard("run", "-m", lm, "--mmproj", mmproj, "--image", str(tmp_path / "junk.png"), "-p", "x", check=False)
    assert proc.returncode == 1 and "junk.png" in proc.stderr
    # an mmproj whose output width is not the model's (the 7B encoder, header only)
    big = tmp_path / "big-mmproj.gguf"
    subprocess.run([SYNTH, "--shape", "qwen25vl7b-mmproj", "-o", str(big), "--quiet", "--header-only"], check=True)
    proc = run_pshard("run", "-m", lm, "--mmproj", str(big), "-p", "x", check=False)
    assert proc.returncode == 1 and "3584" in proc.stderr and "256" in proc.stderr
    # a model that takes no images
    llama = tmp_path / "llama.gguf"
    subprocess.run([SYNTH, "--shape", "tiny-llama", "-o", str(llama), "--quiet"], check=True)
    proc = run_pshard("run", "-m", str(llama), "--mmproj", mmproj, "-p", "x", check=False)
    assert proc.returncode == 1 and "takes no images" in proc.stderr
    # more markers than images
    proc = run_pshard("run", "-m", lm, "--mmproj", mmproj, "--image", str(files / "a.png"), "--raw", "-n", "1",
                      "-p", "<__image__> and <__image__>", check=False)
    assert proc.returncode == 1 and "2 image markers" in proc.stderr


def test_no_mmproj_offload(files):
    """--no-mmproj-offload (encode images on the CPU even with the GPU): listed by every command that
    takes --mmproj, the same tokens where the CPU encodes anyway, and refused without --mmproj."""
    for cmd in ("run", "chat", "serve", "plan"):
        assert "--no-mmproj-offload" in run_pshard(cmd, "--help").stdout, cmd
    images = ["a.png"]
    assert pshard_ids(files, "<__image__>Describe: ", images, extra=["--no-mmproj-offload"]) == \
        pshard_ids(files, "<__image__>Describe: ", images)
    proc = run_pshard("run", "-m", str(files / "tiny-qwen25vl.gguf"), "--mmproj", str(files / "tiny-qwen25vl-mmproj.gguf"),
                      "--image", str(files / "a.png"), "--no-mmproj-offload", "--temp", "0", "-n", "2", "-p", "x")
    assert re.search(r"images: 1 encoded in \d+ ms \(within the TTFT\), on the CPU", proc.stderr), proc.stderr
    assert re.search(r"^load: [\d.]+ s \(.*; the vision encoder [\d.]+ s\)$", proc.stderr, re.M), proc.stderr
    for cmd in ("run", "chat", "serve", "batch"):
        proc = run_pshard(cmd, "-m", str(files / "tiny-qwen25vl.gguf"), "--no-mmproj-offload", "-p", "x", check=False)
        assert proc.returncode == 2 and "--no-mmproj-offload" in proc.stderr and "--mmproj PATH" in proc.stderr, \
            (cmd, proc.stderr)


def test_chat_image_command(files):
    """/image PATH in pshard chat: the image goes with the next message; the next turn reuses the
    cells of everything before it, the image's included (its prompt is only the new turn)."""
    lm, mmproj = str(files / "tiny-qwen25vl.gguf"), str(files / "tiny-qwen25vl-mmproj.gguf")
    stdin = f"/image {files / 'a.png'}\nDescribe it\nAnd again\n/image {files / 'none.png'}\n/quit\n"
    proc = subprocess.run([os.path.join(BUILD, "pshard"), "chat", "-m", lm, "--mmproj", mmproj, "--temp", "0", "-n", "4",
                           "-t", "2"], input=stdin.encode(), capture_output=True, timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "(1 image for your next message)" in err
    turns = [(int(a), int(b)) for a, b in re.findall(r"prompt: (\d+) tokens \((\d+) reused\)", err)]
    assert len(turns) == 2 and turns[0][1] == 0
    assert turns[0][0] > 77 and turns[1][1] > 77 and turns[1][0] < 20  # the 11x7-token image is not read again
    assert len(re.findall(r"images: 1 encoded in \d+ ms \(within the TTFT\), on the CPU", err)) == 1  # nor encoded again
    assert "none.png: cannot read" in err
    proc = subprocess.run([os.path.join(BUILD, "pshard"), "chat", "-m", lm, "-n", "1"],
                          input=f"/image {files / 'a.png'}\n/quit\n".encode(), capture_output=True, timeout=300)
    assert "--mmproj" in proc.stderr.decode()
