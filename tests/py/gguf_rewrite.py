"""Rewriting a GGUF file with the gguf package (an implementation no one here wrote): metadata
values changed or added, tensors added, for models the tests need that gguf-synth does not
write, well formed or not."""
import gguf
import numpy as np


def rewrite(src, dst, value=lambda name, v: v, add_keys=(), after=lambda name: ()):
    """src written again to dst by the gguf package: each metadata value through value(name, v),
    the (key, u32) pairs of add_keys added, and after each tensor those after(its name) gives as
    (name, F32 array)."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value(name, f.contents()), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(name, value(name, f.contents()), f.types[0])
    for key, v in add_keys:
        w.add_uint32(key, v)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=[int(x) for x in reversed(t.shape.tolist())],
                     raw_dtype=t.tensor_type)
        for name, data in after(t.name):
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def with_shared_expert(src, dst, rows, metadata_rows, seed=7):
    """src (an F32 qwen3moe file) with a shared expert of `rows` rows and its sigmoid gate in
    every layer; metadata_rows is the width the metadata declares (None: the key left out)."""
    fields = gguf.GGUFReader(src).fields
    arch = fields["general.architecture"].contents()
    d = fields[arch + ".embedding_length"].contents()
    rng = np.random.default_rng(seed)

    def shared(name):
        if not name.endswith("ffn_down_exps.weight"):
            return []
        p = name[:-len("ffn_down_exps.weight")]
        return [(p + "ffn_gate_shexp.weight", rng.standard_normal((rows, d), dtype=np.float32) * 0.05),
                (p + "ffn_up_shexp.weight", rng.standard_normal((rows, d), dtype=np.float32) * 0.05),
                (p + "ffn_down_shexp.weight", rng.standard_normal((d, rows), dtype=np.float32) * 0.05),
                (p + "ffn_gate_inp_shexp.weight", rng.standard_normal(d, dtype=np.float32) * 0.1)]
    keys = [] if metadata_rows is None else [(arch + ".expert_shared_feed_forward_length", metadata_rows)]
    return rewrite(src, dst, add_keys=keys, after=shared)
