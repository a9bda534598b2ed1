"""The GGUF half of scripts/reference_decode.py (see its docstring): a
greedy float64 decode of a GGUF's model with numpy, its tensors
dequantized by gguf-py."""

import json
import math

import numpy as np
import gguf

from gguf_reader import Reader


def load(path):
    r = Reader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    w = {}
    for t in r.tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = [int(d) for d in reversed(t.shape)]
        w[t.name] = np.asarray(x, dtype=np.float64).reshape(shape)
    return meta, w


def rms(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope_tables(pos, d, base):
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    a = np.outer(np.arange(pos), inv)  # [pos, d/2]
    return np.cos(a), np.sin(a)


def rope(x, cos, sin, pairs):
    """x: [t, heads, d]; cos, sin: [t, d/2]."""
    c, s = cos[:, None, :], sin[:, None, :]
    if pairs:  # llama.cpp's llama: (2i, 2i + 1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out
    h = x.shape[-1] // 2  # "rotate half"
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class Model:
    def __init__(self, meta, w):
        a = meta["general.architecture"]
        g = lambda k, d=None: meta.get(f"{a}.{k}", d)
        self.arch, self.w = a, w
        self.layers = int(g("block_count"))
        self.h = int(g("embedding_length"))
        self.nh = int(g("attention.head_count"))
        self.nkv = int(g("attention.head_count_kv", self.nh))
        self.hd = int(g("attention.key_length", self.h // self.nh))
        self.eps = float(g("attention.layer_norm_rms_epsilon"))
        self.base = float(g("rope.freq_base", 10000.0))
        self.gemma = a == "gemma3"
        self.window = int(g("attention.sliding_window", 0)) if self.gemma else 0
        self.local_base = float(g("rope.freq_base_swa", 10000.0))
        self.pairs = a == "llama"
        self.scale = self.hd ** -0.5
        self.head = w.get("output.weight", w["token_embd.weight"])

    def layer_kind(self, l):
        if self.gemma and self.window and l % 6 < 5:
            return self.window, self.local_base
        return None, self.base

    def forward(self, ids, cache):
        """ids at positions len(cache[0][0]).. : the hidden states [t, h]."""
        w, t = self.w, len(ids)
        x = self.w["token_embd.weight"][ids]
        if self.gemma:
            x = x * math.sqrt(self.h)
        start = cache[0][0].shape[0]
        for l in range(self.layers):
            p = f"blk.{l}."
            window, base = self.layer_kind(l)
            cos, sin = rope_tables(start + t, self.hd, base)
            cos, sin = cos[start:], sin[start:]
            y = rms(x, w[p + "attn_norm.weight"], self.eps)
            q = (y @ w[p + "attn_q.weight"].T).reshape(t, self.nh, self.hd)
            k = (y @ w[p + "attn_k.weight"].T).reshape(t, self.nkv, self.hd)
            v = (y @ w[p + "attn_v.weight"].T).reshape(t, self.nkv, self.hd)
            if p + "attn_q.bias" in w:
                q = q + w[p + "attn_q.bias"].reshape(self.nh, self.hd)
                k = k + w[p + "attn_k.bias"].reshape(self.nkv, self.hd)
                v = v + w[p + "attn_v.bias"].reshape(self.nkv, self.hd)
            if self.gemma:
                q = rms(q, w[p + "attn_q_norm.weight"], self.eps)
                k = rms(k, w[p + "attn_k_norm.weight"], self.eps)
            q, k = rope(q, cos, sin, self.pairs), rope(k, cos, sin, self.pairs)
            cache[l] = (np.concatenate([cache[l][0], k]), np.concatenate([cache[l][1], v]))
            K, V = cache[l]
            n = K.shape[0]
            qpos = np.arange(start, start + t)[:, None]
            kpos = np.arange(n)[None, :]
            seen = kpos <= qpos
            if window:
                seen &= (qpos - kpos) < window
            group = self.nh // self.nkv
            out = np.empty((t, self.nh, self.hd))
            for i in range(self.nh):
                s = (q[:, i, :] @ K[:, i // group, :].T) * self.scale
                s = np.where(seen, s, -np.inf)
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                out[:, i, :] = (s / s.sum(axis=-1, keepdims=True)) @ V[:, i // group, :]
            o = out.reshape(t, self.nh * self.hd) @ w[p + "attn_output.weight"].T
            if self.gemma:
                o = rms(o, w[p + "post_attention_norm.weight"], self.eps)
            x = x + o
            y = rms(x, w[p + "ffn_norm.weight"], self.eps)
            gate, up = y @ w[p + "ffn_gate.weight"].T, y @ w[p + "ffn_up.weight"].T
            act = gelu_tanh(gate) if self.gemma else gate / (1.0 + np.exp(-gate))
            m = (act * up) @ w[p + "ffn_down.weight"].T
            if self.gemma:
                m = rms(m, w[p + "post_ffw_norm.weight"], self.eps)
            x = x + m
        return x

    def logits(self, x):
        return rms(x[-1], self.w["output_norm.weight"], self.eps) @ self.head.T


def main(argv):
    path, ids, new = argv[0], [int(i) for i in argv[1].split(",")], int(argv[2])
    first = "--first" in argv
    meta, w = load(path)
    m = Model(meta, w)
    empty = (np.zeros((0, m.nkv, m.hd)), np.zeros((0, m.nkv, m.hd)))
    cache = [empty for _ in range(m.layers)]
    x = m.forward(ids, cache)
    tokens, steps = [], []
    for n in range(new):
        logits = m.logits(x)
        if not first or n == 0:
            steps.append([float(v) for v in logits])
        nxt = int(np.argmax(logits))
        tokens.append(nxt)
        if n + 1 < new:
            x = m.forward([nxt], cache)
    print(json.dumps({"tokens": tokens, "logits": steps}))
