#!/usr/bin/env python3
"""An independent reference for gkq-decode's forward pass, from the source
files alone and the published equations of each architecture.

- MODEL_DIR (config.json, model.safetensors; Qwen2/Llama): RMSNorm, rotary
  positions ("rotate half"), grouped-query causal attention, SwiGLU MLP,
  tied or untied lm_head. Standard library only, in float64, one token at
  a time (for small models: the committed tiny model takes a second).
- MODEL.gguf (llama, qwen2, gemma3; numpy and gguf-py): every tensor
  dequantized with gguf-py's dequantize (its twin of ggml's), then the
  forward pass in float64 as llama.cpp's graphs define it: for llama the
  rotary pairs adjacent (llama.cpp's permuted q and k); for Gemma 3 the
  embedding scaled by sqrt(hidden), q and k norms, norms after attention
  and after the MLP (the GGUF's norms hold 1 + w), GELU (tanh), local
  layers of 512 positions with rope base 10,000 and every sixth global
  with the GGUF's base, queries scaled by head_dim ** -0.5.

Prints a JSON object with the greedy tokens and the logits of each step
after the prompt (with --first, the first step's only):

    python3 scripts/reference_decode.py MODEL_DIR 5,17,300 4
    python3 scripts/reference_decode.py MODEL.gguf 1,4093,198 8 --first
"""

import json
import math
import struct
import sys


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "F32":
            vals = list(struct.unpack("<%df" % (len(raw) // 4), raw))
        elif t["dtype"] == "BF16":
            vals = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        elif t["dtype"] == "F16":
            vals = list(struct.unpack("<%de" % (len(raw) // 2), raw))
        else:
            raise SystemExit("unsupported dtype " + t["dtype"])
        shape = t["shape"]
        if len(shape) == 2:
            r, c = shape
            vals = [vals[i * c:(i + 1) * c] for i in range(r)]
        out[name] = vals
    return out


def matvec(w, x):
    return [sum(wi * xi for wi, xi in zip(row, x)) for row in w]


def rms_norm(x, w, eps):
    s = math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v / s * g for v, g in zip(x, w)]


def rope(v, pos, theta):
    d = len(v)
    half = d // 2
    out = [0.0] * d
    for i in range(half):
        a = pos * (1.0 / theta ** (2 * i / d))
        c, s = math.cos(a), math.sin(a)
        out[i] = v[i] * c - v[i + half] * s
        out[i + half] = v[i + half] * c + v[i] * s
    return out


def silu(x):
    return x / (1.0 + math.exp(-x))


def main():
    if sys.argv[1].endswith(".gguf"):
        import reference_gguf  # numpy and gguf-py: only for a GGUF

        return reference_gguf.main(sys.argv[1:])
    model, ids, new = sys.argv[1], [int(i) for i in sys.argv[2].split(",")], int(sys.argv[3])
    cfg = json.load(open(model + "/config.json"))
    w = load_safetensors(model + "/model.safetensors")
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim", h // nh)
    eps, theta = cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0)
    emb = w["model.embed_tokens.weight"]
    head = w.get("lm_head.weight", emb)
    layers = cfg["num_hidden_layers"]
    cache = [([], []) for _ in range(layers)]
    steps, tokens = [], []
    seq = list(ids)
    pos = 0
    for step in range(len(ids) + new - 1):
        x = list(emb[seq[pos]])
        for l in range(layers):
            p = "model.layers.%d." % l
            t = rms_norm(x, w[p + "input_layernorm.weight"], eps)
            q = matvec(w[p + "self_attn.q_proj.weight"], t)
            k = matvec(w[p + "self_attn.k_proj.weight"], t)
            v = matvec(w[p + "self_attn.v_proj.weight"], t)
            if p + "self_attn.q_proj.bias" in w:
                q = [a + b for a, b in zip(q, w[p + "self_attn.q_proj.bias"])]
                k = [a + b for a, b in zip(k, w[p + "self_attn.k_proj.bias"])]
                v = [a + b for a, b in zip(v, w[p + "self_attn.v_proj.bias"])]
            ks = [rope(k[j * hd:(j + 1) * hd], pos, theta) for j in range(nkv)]
            vs = [v[j * hd:(j + 1) * hd] for j in range(nkv)]
            cache[l][0].append(ks)
            cache[l][1].append(vs)
            attn = []
            for i in range(nh):
                qi = rope(q[i * hd:(i + 1) * hd], pos, theta)
                g = i // (nh // nkv)
                scores = [sum(a * b for a, b in zip(qi, kk[g])) / math.sqrt(hd) for kk in cache[l][0]]
                m = max(scores)
                e = [math.exp(s - m) for s in scores]
                z = sum(e)
                attn.extend(sum(e[j] / z * cache[l][1][j][g][d] for j in range(len(e))) for d in range(hd))
            o = matvec(w[p + "self_attn.o_proj.weight"], attn)
            x = [a + b for a, b in zip(x, o)]
            t = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
            gate = matvec(w[p + "mlp.gate_proj.weight"], t)
            up = matvec(w[p + "mlp.up_proj.weight"], t)
            x = [a + b for a, b in zip(x, matvec(w[p + "mlp.down_proj.weight"], [silu(a) * b for a, b in zip(gate, up)]))]
        pos += 1
        if pos >= len(ids):
            logits = matvec(head, rms_norm(x, w["model.norm.weight"], eps))
            steps.append(logits)
            nxt = max(range(len(logits)), key=lambda i: logits[i])
            tokens.append(nxt)
            seq.append(nxt)
    print(json.dumps({"tokens": tokens, "logits": steps}))


if __name__ == "__main__":
    main()
