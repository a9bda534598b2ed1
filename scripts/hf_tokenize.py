#!/usr/bin/env python3
"""The Python reference for gkq's tokenizers and chat templates (Hugging
Face's `tokenizers` and `jinja2`, as `transformers` uses them), for a
GGUF's `tokenizer.ggml.*` keys read with gguf-py:

    python3 scripts/hf_tokenize.py MODEL.gguf < requests.jsonl > ids.jsonl

Each request line is `{"text": …}` (a prompt: BOS added as the GGUF says,
special-token strings parsed) or `{"messages": [...], "template": …}` (the
chat template rendered with jinja2 as `apply_chat_template` renders it:
trim_blocks, lstrip_blocks, add_generation_prompt, bos_token, eos_token,
raise_exception; the GGUF's template unless the request gives one; then
tokenized with nothing added). Each answer line is `{"ids": […]}`, with
`"rendered"` for a chat.

The tokenizer is built as Hugging Face's own tokenizer.json of the model
family would be, not by porting gkq's code:
- `gpt2` vocabularies: byte-level BPE from the vocabulary and the merges,
  with the pre-tokenizer that `tokenizer.ggml.pre` names (`smollm`: one
  digit at a time, then GPT-2's byte-level split);
- `llama` (SentencePiece) vocabularies: BPE with byte fallback whose merges
  are every pair of tokens that makes a token, ranked by the score of the
  token they make (SentencePiece's own rule), spaces as "▁".
"""

import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from gguf_reader import Reader


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def byte_level(vocab, merges, pre):
    t = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges]))
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "command-r", "codeshell"):
        t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl])
    elif pre in ("gpt2", "gpt-2", "default"):
        t.pre_tokenizer = bl
    else:
        sys.exit(f"hf_tokenize: no reference pre-tokenizer for {pre!r}")
    t.decoder = decoders.ByteLevel()
    return t


def sentencepiece(tokens, scores, types):
    vocab = {}
    for i, tok in enumerate(tokens):
        vocab[tok] = i
    score = {tok: scores[vocab[tok]] for tok in vocab}
    merges = []
    for tok in vocab:
        if types[vocab[tok]] not in (1,):  # only normal tokens are merged to
            continue
        for cut in range(1, len(tok)):
            a, b = tok[:cut], tok[cut:]
            if a in vocab and b in vocab:
                merges.append((score[tok], vocab[tok], a, b))
    merges.sort(key=lambda m: (-m[0], m[1]))
    t = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for _, _, a, b in merges],
                             byte_fallback=True, fuse_unk=False))
    t.normalizer = normalizers.Replace(" ", "\u2581")
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return t


def build(path):
    r = Reader(path)
    model = field(r, "tokenizer.ggml.model")
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type") or [1] * len(tokens)
    if model == "gpt2":
        vocab = {tok: i for i, tok in enumerate(tokens)}
        t = byte_level(vocab, field(r, "tokenizer.ggml.merges"), field(r, "tokenizer.ggml.pre") or "default")
        add_bos_default = False
    elif model == "llama":
        t = sentencepiece(tokens, field(r, "tokenizer.ggml.scores"), types)
        add_bos_default = True
    else:
        sys.exit(f"hf_tokenize: tokenizer.ggml.model {model!r}")
    # control tokens are special, user-defined ones are matched whole
    specials = [AddedToken(tok, special=True, normalized=False)
                for tok, ty in zip(tokens, types) if ty == 3]
    users = [AddedToken(tok, special=False, normalized=False)
             for tok, ty in zip(tokens, types) if ty == 4]
    t.add_special_tokens(specials)
    t.add_tokens(users)
    add_bos = field(r, "tokenizer.ggml.add_bos_token")
    add_bos = add_bos_default if add_bos is None else add_bos
    bos = field(r, "tokenizer.ggml.bos_token_id")
    eos = field(r, "tokenizer.ggml.eos_token_id")
    meta = {
        "add_bos": add_bos,
        "bos": bos,
        "bos_token": tokens[bos] if bos is not None else "",
        "eos_token": tokens[eos] if eos is not None else "",
        "template": field(r, "tokenizer.chat_template"),
    }
    return t, meta


def render(template, messages, bos_token, eos_token):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos_token, eos_token=eos_token)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    t, meta = build(sys.argv[1])
    for line in sys.stdin:
        req = json.loads(line)
        if "messages" in req:
            template = req.get("template") or meta["template"]
            text = render(template, req["messages"], meta["bos_token"], meta["eos_token"])
            ids = t.encode(text, add_special_tokens=False).ids
            print(json.dumps({"ids": ids, "rendered": text}))
        else:
            ids = t.encode(req["text"], add_special_tokens=False).ids
            if meta["add_bos"]:
                ids = [meta["bos"]] + ids
            print(json.dumps({"ids": ids}))


if __name__ == "__main__":
    main()
