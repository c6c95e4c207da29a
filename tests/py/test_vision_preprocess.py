"""Image preprocessing against an independent reference: Hugging Face's Qwen2-VL processor
rule written out here in Python (smart resize) and run with Pillow and numpy (decode, BICUBIC
resize, rescale and normalize in float32, the patch layout by reshape and transpose), compared
with libpshard's vision_* functions through ctypes.

Tolerances: smart resize exact for every size tried; PNG input exact pixels after resizing and
patch values within 1e-6 (float32 rounding of the same arithmetic); JPEG input within 2 levels
of 255 after decoding and resizing (libjpeg-turbo builds may differ by a level), so patch values
within 2/255/std = 0.031."""
import ctypes
import math
import os
from pathlib import Path

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")

ROOT = Path(__file__).resolve().parents[2]
LIB_PATH = Path(os.environ.get("PSHARD_BUILD_DIR", ROOT / "build")) / "libpshard.so"
IMAGES = ROOT / "tests" / "data" / "image"
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]


class VisionImage(ctypes.Structure):
    _fields_ = [("width", ctypes.c_uint32), ("height", ctypes.c_uint32), ("rgb", ctypes.POINTER(ctypes.c_uint8))]


class VisionHparams(ctypes.Structure):  # src/vision/mmproj.h, field for field
    _fields_ = [("projector", ctypes.c_int), ("projector_name", ctypes.c_char * 48)] + [
        (n, ctypes.c_uint32) for n in ("image_size", "patch_size", "spatial_merge", "n_embd", "n_ff", "n_layer",
                                       "n_head", "head_dim", "projection_dim")] + [
        ("eps", ctypes.c_float), ("image_mean", ctypes.c_float * 3), ("image_std", ctypes.c_float * 3),
        ("window_size", ctypes.c_uint32), ("n_wa_pattern", ctypes.c_uint32), ("n_full_attention", ctypes.c_uint32),
        ("full_attention", ctypes.c_bool * 256), ("min_pixels", ctypes.c_uint64), ("max_pixels", ctypes.c_uint64)]


class VisionPatches(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("height", "width", "grid_t", "grid_h", "grid_w", "patch_dim")] + [
        ("n_patches", ctypes.c_uint64), ("data", ctypes.POINTER(ctypes.c_float))]


@pytest.fixture(scope="module")
def lib():
    if not LIB_PATH.exists():
        pytest.skip(f"{LIB_PATH} not built")
    lib = ctypes.CDLL(str(LIB_PATH))
    u32p = ctypes.POINTER(ctypes.c_uint32)
    lib.vision_smart_resize.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64,
                                        ctypes.c_uint64, u32p, u32p]
    lib.vision_image_load.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(VisionImage)]
    lib.vision_resize_bicubic.argtypes = [ctypes.POINTER(VisionImage), ctypes.c_uint32, ctypes.c_uint32,
                                          ctypes.POINTER(VisionImage)]
    lib.vision_preprocess.argtypes = [ctypes.POINTER(VisionHparams), ctypes.POINTER(VisionImage),
                                      ctypes.POINTER(VisionPatches)]
    lib.vision_image_free.argtypes = [ctypes.POINTER(VisionImage)]
    lib.vision_patches_free.argtypes = [ctypes.POINTER(VisionPatches)]
    return lib


def smart_resize(height, width, factor=28, min_pixels=3136, max_pixels=12845056):
    """The processor's rule (transformers' Qwen2-VL image processor), with its max(factor, ...)
    guard for extreme aspect ratios; None where it refuses the image."""
    if max(height, width) / min(height, width) > 200:
        return None
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def reference_patches(pixels, patch=14, merge=2, temporal=2):
    """pixels: float32 (H, W, 3), normalized. The processor's flatten: (t, c, h, w) reshaped to
    (grid_t, T, C, gh/m, m, P, gw/m, m, P), transposed to (0, 3, 6, 4, 7, 2, 1, 5, 8)."""
    chw = np.transpose(pixels, (2, 0, 1))[None].repeat(temporal, axis=0)
    c, h, w = chw.shape[1:]
    gh, gw = h // patch, w // patch
    x = chw.reshape(1, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gh * gw, c * temporal * patch * patch)


def normalize(rgb8):
    scaled = (rgb8.astype(np.float64) * (1 / 255)).astype(np.float32)
    return (scaled - np.array(MEAN, dtype=np.float32)) / np.array(STD, dtype=np.float32)


def test_smart_resize_matches_the_processor_rule(lib):
    rng = np.random.default_rng(7)
    sizes = [(30, 40), (480, 640), (1080, 1920), (2240, 4032), (1, 1), (42, 70), (70, 42), (100, 20000),
             (100, 20001), (4032, 3024), (16384, 16384), (10, 2000), (27, 29), (56, 56)]
    sizes += [tuple(int(v) for v in rng.integers(1, 9000, size=2)) for _ in range(400)]
    for max_pixels in (12845056, 1003520, 200704):
        for h, w in sizes:
            oh, ow = ctypes.c_uint32(), ctypes.c_uint32()
            st = lib.vision_smart_resize(h, w, 28, 3136, max_pixels, ctypes.byref(oh), ctypes.byref(ow))
            want = smart_resize(h, w, max_pixels=max_pixels)
            if want is None:
                assert st != 0, (h, w)
            else:
                assert st == 0 and (oh.value, ow.value) == want, (h, w, max_pixels, oh.value, ow.value, want)


def hparams(max_pixels=12845056):
    hp = VisionHparams(patch_size=14, spatial_merge=2, min_pixels=3136, max_pixels=max_pixels)
    hp.image_mean[:] = MEAN
    hp.image_std[:] = STD
    return hp


def run(lib, path, max_pixels=12845056):
    img, patches = VisionImage(), VisionPatches()
    assert lib.vision_image_load(str(path).encode(), None, ctypes.byref(img)) == 0
    assert lib.vision_preprocess(ctypes.byref(hparams(max_pixels)), ctypes.byref(img), ctypes.byref(patches)) == 0
    got = np.ctypeslib.as_array(patches.data, shape=(patches.n_patches, patches.patch_dim)).copy()
    shape = (patches.height, patches.width, patches.grid_h, patches.grid_w)
    lib.vision_patches_free(ctypes.byref(patches))
    lib.vision_image_free(ctypes.byref(img))
    return got, shape


@pytest.mark.parametrize("size", [(40, 30), (300, 200), (97, 401), (640, 480), (33, 1500)])
def test_png_patches_match_pillow(lib, tmp_path, size):
    """A noisy RGB picture (the hardest case for resampling) through decode, resize, normalize
    and patches, against Pillow's BICUBIC and numpy."""
    rng = np.random.default_rng(size[0] * 1000 + size[1])
    src = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    src[:, : size[0] // 2] //= 3  # some structure besides the noise
    path = tmp_path / "in.png"
    Image.fromarray(src).save(path)
    max_pixels = 200704 if size == (640, 480) else 12845056  # also shrinking
    got, (h, w, gh, gw) = run(lib, path, max_pixels)
    assert (h, w) == smart_resize(size[1], size[0], max_pixels=max_pixels)
    resized = np.asarray(Image.fromarray(src).resize((w, h), Image.Resampling.BICUBIC))
    want = reference_patches(normalize(resized))
    assert got.shape == want.shape == (gh * gw, 1176)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_jpeg_and_the_test_images(lib):
    """The checked-in images (make_images.py): JPEGs within the stated tolerance, PNGs
    (gray, palette, solid) exactly."""
    for name in sorted(os.listdir(IMAGES)):
        if not name.endswith((".png", ".jpg")) or name.startswith("alpha"):
            continue
        got, (h, w, _, _) = run(lib, IMAGES / name)
        src = Image.open(IMAGES / name).convert("RGB")
        assert (h, w) == smart_resize(src.height, src.width)
        want = reference_patches(normalize(np.asarray(src.resize((w, h), Image.Resampling.BICUBIC))))
        atol = 2 / 255 / min(STD) + 1e-6 if name.endswith(".jpg") else 1e-6
        np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=name)


def test_transparency_over_white_as_the_processor(lib):
    """The processor's convert_to_rgb: RGBA composited over a white background (PIL's
    alpha_composite); ours within one level of it."""
    img = VisionImage()
    assert lib.vision_image_load(str(IMAGES / "alpha_40x30.png").encode(), None, ctypes.byref(img)) == 0
    got = np.ctypeslib.as_array(img.rgb, shape=(img.height, img.width, 3)).astype(int).copy()
    lib.vision_image_free(ctypes.byref(img))
    rgba = Image.open(IMAGES / "alpha_40x30.png").convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    want = np.asarray(Image.alpha_composite(white, rgba).convert("RGB")).astype(int)
    assert np.abs(got - want).max() <= 1
    assert (want[0] >= 250).all() and np.abs(want[-1] - got[-1]).max() <= 1
