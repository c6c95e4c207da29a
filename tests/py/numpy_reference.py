"""An independent forward pass in numpy, built on the gguf package's reader and dequantizers:
the reference the C engine's logits are checked against on synthetic models (and a second
opinion on the default model). Plain and slow on purpose: every step reads as the math.

With act_quant=True the input of every product with a Q8_0/Q4_0/Q5_0 weight is first rounded
the way llama.cpp's x86 CPU backend rounds it (blocks of 32, scale amax/127 stored as f16,
values times 127/amax rounded half to even), and inputs of F16 weights are rounded to f16, so
the reference computes the same function as the engines rather than the unrounded one."""
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

Q8_0_ACTS = {GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q5_0}


def round_like_q8_0(x):
    """x [..., n] -> the values a Q8_0 activation row represents."""
    shape = x.shape
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint((b * inv).astype(np.float32))  # rint: half to even
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    return (q * d).reshape(shape)


class Model:
    def __init__(self, path, act_quant=False):
        self.act_quant = act_quant
        self.types = {}
        r = GGUFReader(path)
        self.f = {k: v for k, v in r.fields.items()}
        self.arch = self.get("general.architecture")
        a = self.arch
        self.n_layer = self.get(a + ".block_count")
        self.d = self.get(a + ".embedding_length")
        self.n_head = self.get(a + ".attention.head_count")
        self.n_head_kv = self.get(a + ".attention.head_count_kv", self.n_head)
        self.head_k = self.get(a + ".attention.key_length", self.d // self.n_head)
        self.head_v = self.get(a + ".attention.value_length", self.head_k)
        self.rope_dim = self.get(a + ".rope.dimension_count", self.head_k)
        self.base = float(self.get(a + ".rope.freq_base", 10000.0))
        self.eps = float(self.get(a + ".attention.layer_norm_rms_epsilon", 1e-5))
        self.n_expert = self.get(a + ".expert_count", 0)
        self.n_used = self.get(a + ".expert_used_count", 0)
        self.neox = a != "llama"
        self.t = {}
        for t in r.tensors:
            shape = [int(x) for x in reversed(t.shape.tolist())]  # numpy order: slowest first
            self.t[t.name] = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
            self.types[t.name] = t.tensor_type

    def get(self, key, default=None):
        f = self.f.get(key)
        return default if f is None else f.contents()

    def w(self, name):
        return self.t.get(name)

    def act(self, x, name):
        """The input of a product with weight `name`, rounded as the engines round it."""
        if not self.act_quant:
            return x
        wtype = self.types[name]
        if wtype in Q8_0_ACTS:
            return round_like_q8_0(x)
        if wtype == GGMLQuantizationType.F16:
            return x.astype(np.float16).astype(np.float32)
        if wtype == GGMLQuantizationType.F32:
            return x
        raise NotImplementedError("activation rounding for %s" % wtype.name)

    def mm(self, x, name, expert=None):
        w = self.t[name] if expert is None else self.t[name][expert]
        return (self.act(x, name).astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)


def rmsnorm(x, w, eps):
    x64 = x.astype(np.float64)
    y = (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps)).astype(np.float32)
    return y * w if w is not None else y


def rope(x, pos, m):
    """x: [n_heads, head] at position pos."""
    half = m.rope_dim // 2
    inv = m.base ** (-2.0 * np.arange(half) / m.rope_dim)
    ang = pos * inv
    c, s = np.cos(ang), np.sin(ang)
    x = x.astype(np.float64).copy()
    if m.neox:
        a, b = x[:, :half].copy(), x[:, half:2 * half].copy()
        x[:, :half], x[:, half:2 * half] = a * c - b * s, a * s + b * c
    else:
        a, b = x[:, 0:2 * half:2].copy(), x[:, 1:2 * half:2].copy()
        x[:, 0:2 * half:2], x[:, 1:2 * half:2] = a * c - b * s, a * s + b * c
    return x.astype(np.float32)


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward(m, tokens):
    """Logits [len(tokens), vocab] for one sequence."""
    n = len(tokens)
    x = m.w("token_embd.weight")[tokens].copy()
    ks = [np.zeros((0, m.n_head_kv, m.head_k), np.float32) for _ in range(m.n_layer)]
    vs = [np.zeros((0, m.n_head_kv, m.head_v), np.float32) for _ in range(m.n_layer)]
    group = m.n_head // m.n_head_kv
    for il in range(m.n_layer):
        p = "blk.%d." % il
        h = rmsnorm(x, m.w(p + "attn_norm.weight"), m.eps)
        q = m.mm(h, p + "attn_q.weight")
        k = m.mm(h, p + "attn_k.weight")
        v = m.mm(h, p + "attn_v.weight")
        for name, arr in (("attn_q.bias", q), ("attn_k.bias", k), ("attn_v.bias", v)):
            if m.w(p + name) is not None:
                arr += m.w(p + name)
        q = q.reshape(n, m.n_head, m.head_k)
        k = k.reshape(n, m.n_head_kv, m.head_k)
        v = v.reshape(n, m.n_head_kv, m.head_v)
        if m.w(p + "attn_q_norm.weight") is not None:
            q = rmsnorm(q, m.w(p + "attn_q_norm.weight"), m.eps)
            k = rmsnorm(k, m.w(p + "attn_k_norm.weight"), m.eps)
        q = np.stack([rope(q[t], t, m) for t in range(n)])
        k = np.stack([rope(k[t], t, m) for t in range(n)])
        # The cache holds f16, as every engine under test stores it; q meets it rounded to f16.
        if m.act_quant:
            q = q.astype(np.float16).astype(np.float32)
        k = k.astype(np.float16).astype(np.float32)
        v = v.astype(np.float16).astype(np.float32)
        out = np.zeros((n, m.n_head, m.head_v), np.float32)
        for t in range(n):
            for hh in range(m.n_head):
                kv = hh // group
                scores = (k[:t + 1, kv] @ q[t, hh]) / np.sqrt(m.head_k)
                pr = np.exp(scores - scores.max())
                pr /= pr.sum()
                out[t, hh] = pr @ v[:t + 1, kv]
        x = x + m.mm(out.reshape(n, -1), p + "attn_output.weight")
        h = rmsnorm(x, m.w(p + "ffn_norm.weight"), m.eps)
        if m.n_expert:
            logits = m.mm(h, p + "ffn_gate_inp.weight")
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            y = np.zeros_like(x)
            for t in range(n):
                top = np.argsort(-probs[t], kind="stable")[:m.n_used]
                wts = probs[t, top] / probs[t, top].sum()
                for e, wgt in zip(top, wts):
                    g = m.mm(h[t:t + 1], p + "ffn_gate_exps.weight", e)[0]
                    u = m.mm(h[t:t + 1], p + "ffn_up_exps.weight", e)[0]
                    y[t] += wgt * m.mm((silu(g) * u)[None], p + "ffn_down_exps.weight", e)[0]
            x = x + y
            if m.w(p + "ffn_gate_shexp.weight") is not None:  # a shared expert every token takes
                sh = m.mm(silu(m.mm(h, p + "ffn_gate_shexp.weight")) * m.mm(h, p + "ffn_up_shexp.weight"),
                          p + "ffn_down_shexp.weight")
                if m.w(p + "ffn_gate_inp_shexp.weight") is not None:  # scaled by a sigmoid gate
                    logit = h.astype(np.float64) @ m.w(p + "ffn_gate_inp_shexp.weight").reshape(-1).astype(np.float64)
                    sh = sh * (1.0 / (1.0 + np.exp(-logit)))[:, None].astype(np.float32)
                x = x + sh
        else:
            g = m.mm(h, p + "ffn_gate.weight")
            u = m.mm(h, p + "ffn_up.weight")
            x = x + m.mm(silu(g) * u, p + "ffn_down.weight")
    h = rmsnorm(x, m.w("output_norm.weight"), m.eps)
    return m.mm(h, "output.weight" if m.w("output.weight") is not None else "token_embd.weight")
