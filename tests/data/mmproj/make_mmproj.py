"""Writes tiny_patch2.gguf: the smallest well-formed Qwen2.5-VL mmproj (2 blocks, width 8, patch
2, F32), written by the `gguf` package's own GGUFWriter, so a writer other than ours produces
it. The GGUF fuzzer starts from it to reach the mmproj checks, and test_vision_mmproj.c loads
it. Deterministic; the file is committed (run from this folder: python3 make_mmproj.py)."""
import numpy as np
import gguf

E, FF, LAYERS, HEADS, PROJ, P = 8, 8, 2, 2, 8, 2


def main():
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter("tiny_patch2.gguf", "clip")
    w.add_type("mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "qwen2.5vl_merger")
    w.add_bool("clip.use_silu", True)
    for key, v in (("projection_dim", PROJ), ("image_size", 56), ("patch_size", P), ("embedding_length", E),
                   ("feed_forward_length", FF), ("block_count", LAYERS), ("attention.head_count", HEADS),
                   ("n_wa_pattern", 2)):
        w.add_uint32("clip.vision." + key, v)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    w.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])

    def t(name, *shape):  # numpy shape: the GGUF dimensions reversed
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32) * 0.3)

    t("v.patch_embd.weight", E, 3, P, P)
    t("v.patch_embd.weight.1", E, 3, P, P)
    for il in range(LAYERS):
        p = f"v.blk.{il}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(p + n + ".weight", E, E)
            t(p + n + ".bias", E)
        t(p + "ln1.weight", E)
        t(p + "ln2.weight", E)
        t(p + "ffn_gate.weight", FF, E), t(p + "ffn_gate.bias", FF)
        t(p + "ffn_up.weight", FF, E), t(p + "ffn_up.bias", FF)
        t(p + "ffn_down.weight", E, FF), t(p + "ffn_down.bias", E)
    t("v.post_ln.weight", E)
    t("mm.0.weight", 4 * E, 4 * E), t("mm.0.bias", 4 * E)
    t("mm.2.weight", PROJ, 4 * E), t("mm.2.bias", PROJ)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
