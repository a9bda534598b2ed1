#!/usr/bin/env python3
"""Writes a GGUF of a Llama or Qwen2 model directory (config.json +
model.safetensors) with gguf-py's GGUFWriter, the way llama.cpp's
convert_hf_to_gguf.py lays such a model out: llama.cpp's tensor names,
Llama's q/k rows permuted for its rotary layout, 1-D tensors in f32, the
2-D ones in TYPE (f32, f16, q8_0 or q4_0, quantized by gguf.quants), the
hyper-parameters as `{arch}.*` keys and a small byte-level tokenizer.

  gguf_from_model.py MODEL_DIR OUT.gguf TYPE [--split N]

--split N writes shards of at most N tensors each (OUT-00001-of-0000K.gguf).
The test suite's independent GGUF writer (PyPI gguf, from llama.cpp).
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, RopeScalingType, quants


def read_safetensors(path: Path) -> dict:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    dtypes = {"F32": np.float32, "F16": np.float16}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        data = raw[8 + n + a : 8 + n + b]
        if info["dtype"] == "BF16":
            u = np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(data, dtype=dtypes[info["dtype"]]).astype(np.float32)
        out[name] = arr.reshape(info["shape"])
    return out


def gguf_name(hf: str) -> str:
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "lm_head.weight": "output.weight",
        "model.norm.weight": "output_norm.weight",
    }
    if hf in fixed:
        return fixed[hf]
    parts = hf.split(".")
    layer, rest = parts[2], ".".join(parts[3:])
    table = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    return f"blk.{layer}.{table[rest]}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main() -> None:
    model, out, kind = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    split = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--split" else 0
    cfg = json.loads((model / "config.json").read_text())
    arch = cfg["model_type"]
    assert arch in ("llama", "qwen2"), arch
    tensors = read_safetensors(model / "model.safetensors")
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    vocab = cfg["vocab_size"]
    w = GGUFWriter(out, arch, split_max_tensors=split)
    w.add_name("gkq test model")
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_merges([])
    # rope scaling as convert_hf_to_gguf.py writes it: Llama 3's as the
    # per-dimension factors rope_freqs.weight, another as its type and factor
    scaling = cfg.get("rope_scaling") or {}
    kind_of = scaling.get("rope_type", scaling.get("type"))
    if kind_of == "llama3":
        head_dim = cfg["hidden_size"] // heads
        w.add_tensor("rope_freqs.weight", np.ones(head_dim // 2, dtype=np.float32))
    elif kind_of is not None:
        w.add_rope_scaling_type(RopeScalingType(kind_of))
        w.add_rope_scaling_factor(scaling.get("factor", 1.0))
    qtype = {"f32": T.F32, "f16": T.F16, "q8_0": T.Q8_0, "q4_0": T.Q4_0}[kind]
    for hf in sorted(tensors):
        a = tensors[hf]
        name = gguf_name(hf)
        if arch == "llama" and hf.endswith("q_proj.weight"):
            a = permute(a, heads)
        if arch == "llama" and hf.endswith("k_proj.weight"):
            a = permute(a, kv_heads)
        if a.ndim == 1 or qtype == T.F32:
            w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
        elif qtype == T.F16:
            w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float16))
        else:
            w.add_tensor(name, quants.quantize(np.ascontiguousarray(a), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
