"""The tiny vision-language pair the image tests share: gguf-synth's tiny Qwen2.5-VL language model
and its mmproj, and random images."""
import io
import os
import subprocess

import numpy as np

from conftest import BUILD

SYNTH = os.path.join(BUILD, "gguf-synth")


def random_image(rng, h, w, fmt="PNG"):
    """The bytes of an h x w image of random pixels."""
    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(out, format=fmt)
    return out.getvalue()


def write_tiny_vlm(d):
    """tiny-qwen25vl.gguf and tiny-qwen25vl-mmproj.gguf in folder d, with a.png (196x308: 7 x 11
    image tokens) and b.png (120x90: 4 x 3); returns the random generator, for more images."""
    for shape in ("tiny-qwen25vl", "tiny-qwen25vl-mmproj"):
        subprocess.run([SYNTH, "--shape", shape, "-o", str(d / f"{shape}.gguf"), "--quiet"], check=True)
    rng = np.random.default_rng(3)
    (d / "a.png").write_bytes(random_image(rng, 196, 308))
    (d / "b.png").write_bytes(random_image(rng, 120, 90))
    return rng
