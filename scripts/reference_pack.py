#!/usr/bin/env python3
"""Reference converter: a Hugging Face safetensors model -> a GKQ v2 package.

Written from docs/FORMAT.md alone, with numpy and hashlib: the knot (layout
version 5: each role block stored once, in its row file of its own dtype,
with each row's record inline, section 7e; version 3 with
--knot-holds-blocks), one row file and one proof object per role and
--dtype, and the companion files. It is the plain converter that `cargo xtask bench pack`
times gkq-pack against (issue 15), and a second writer of the format: for
the same model and flags it must write byte-identical files (a test checks
this), with `--tool 'gkq-pack 0.1.0'` so that the `gkq.tool` key agrees.

Scope: Qwen2/Llama/Mistral-style checkpoints (`model.embed_tokens.weight`,
`lm_head.weight`), tied or untied; single file or sharded with
model.safetensors.index.json. Every file is fsynced before exit.

    python3 scripts/reference_pack.py MODEL_DIR OUT_DIR [--dtype f32 --dtype bf16]
"""

import argparse
import hashlib
import json
import os
import struct
import sys

import numpy as np

ALIGN = 4096
VERSION, VERSION_5 = 3, 5
MAGIC = b"GKQKNOT\0"
# safetensors dtype -> (FORMAT.md 3.3 code, itemsize)
DTYPES = {
    "F32": (0, 4), "F16": (1, 2), "BF16": (2, 2), "F64": (3, 8), "I8": (4, 1),
    "U8": (5, 1), "I16": (6, 2), "U16": (7, 2), "I32": (8, 4), "U32": (9, 4),
    "I64": (10, 8), "U64": (11, 8), "BOOL": (12, 1), "F8_E5M2": (13, 1),
    "F8_E4M3": (14, 1),
}
FLOATS = ("F32", "F16", "BF16")
COMPANIONS = [
    "added_tokens.json", "config.json", "generation_config.json", "merges.txt",
    "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
    "tokenizer_config.json", "vocab.json", "vocab.txt",
]
COLUMNAR_ELIGIBLE, IN_ROW_FILE = 1, 2
SOURCE_EXACT, BLOCK_EXACT, INLINE_PROOF = 1, 2, 4
STEP_BYTES = 16 << 20  # of f32 values per step through a role tensor


def sha(b):
    return hashlib.sha256(b).digest()


def align_up(x):
    return (x + ALIGN - 1) // ALIGN * ALIGN


# ---------------------------------------------------------------- casts (6)

def to_f32_bits(bits, dt):
    """uint array of `dt` bits -> uint32 f32 bits, NaNs as section 6 says."""
    if dt == "F32":
        return bits.astype(np.uint32, copy=False)
    if dt == "BF16":
        x = bits.astype(np.uint32)
        nan = (x & 0x7FFF) > 0x7F80
        x[nan] |= 0x40
        return x << 16
    x = bits.astype(np.uint32)
    out = bits.view(np.float16).astype(np.float32).view(np.uint32)
    nan = (x & 0x7FFF) > 0x7C00
    out[nan] = ((x[nan] & 0x8000) << 16) | 0x7FC00000 | ((x[nan] & 0x03FF) << 13)
    return out


def from_f32_bits(x, dt):
    """uint32 f32 bits -> uint array of `dt` bits (round to nearest even)."""
    if dt == "F32":
        return x
    nan = (x & 0x7FFFFFFF) > 0x7F800000
    if dt == "BF16":
        out = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
        out[nan] = ((x[nan] >> 16) | 0x0040).astype(np.uint16)
        return out
    with np.errstate(over="ignore"):
        out = x.view(np.float32).astype(np.float16).view(np.uint16)
    out[nan] = (((x[nan] >> 16) & 0x8000) | 0x7E00 | ((x[nan] & 0x007FFFFF) >> 13)).astype(np.uint16)
    return out


def is_inf(bits, dt):
    if dt == "F32":
        return (bits & 0x7FFFFFFF) == 0x7F800000
    if dt == "BF16":
        return (bits & 0x7FFF) == 0x7F80
    return (bits & 0x7FFF) == 0x7C00


def cast(bits, frm, to, tensor, first_row, cols, allow_lossy):
    """Section 6 cast of a chunk of rows; a finite value that becomes
    infinite is refused unless allow_lossy."""
    if frm == to:
        return bits
    out = from_f32_bits(to_f32_bits(bits, frm), to)
    if not allow_lossy:
        bad = np.flatnonzero(is_inf(out, to) & ~is_inf(bits, frm) & ~is_nan(bits, frm))
        if bad.size:
            i = int(bad[0])
            sys.exit(f"reference_pack: tensor {tensor!r} row {first_row + i // cols} col {i % cols}: "
                     f"overflows to infinity in {to}")
    return out


def is_nan(bits, dt):
    if dt == "F32":
        return (bits & 0x7FFFFFFF) > 0x7F800000
    if dt == "BF16":
        return (bits & 0x7FFF) > 0x7F80
    return (bits & 0x7FFF) > 0x7C00


def uint_of(dt):
    return np.uint32 if dt == "F32" else np.uint16


# ------------------------------------------------------- row proofs (7a)

def largest_pow2_below(n):
    return 1 << ((n - 1).bit_length() - 1)


def th(nodes):
    """TH/MTH over already-hashed nodes (no leaf re-hash)."""
    if len(nodes) == 1:
        return nodes[0]
    k = largest_pow2_below(len(nodes))
    return sha(b"\x01" + th(nodes[:k]) + th(nodes[k:]))


def paths_rfc(leaves):
    """RFC 9162 2.1.3.1 PATH(m, D) of every leaf, nearest sibling first."""
    if len(leaves) == 1:
        return leaves[0], [[]]
    k = largest_pow2_below(len(leaves))
    left, lp = paths_rfc(leaves[:k])
    right, rp = paths_rfc(leaves[k:])
    return sha(b"\x01" + left + right), [p + [right] for p in lp] + [p + [left] for p in rp]


def chunk_proof(leaves, h):
    """Root of a chunk and the 32*h-byte record of each of its rows."""
    n = len(leaves)
    if n == 1 << h:  # a perfect tree: siblings level by level
        levels = [leaves]
        for _ in range(h):
            prev = levels[-1]
            levels.append([sha(b"\x01" + prev[i] + prev[i + 1]) for i in range(0, len(prev), 2)])
        records = [b"".join(levels[lv][(m >> lv) ^ 1] for lv in range(h)) for m in range(n)]
        return levels[h][0], records
    root, paths = paths_rfc(leaves)
    return root, [b"".join(p).ljust(32 * h, b"\0") for p in paths]


def proof_height(rows, row_bytes):
    """gkq-pack's choice: a row's path at most 12 % of the row, at most the
    tree's depth, at most 16."""
    return min(row_bytes * 12 // (100 * 32), (rows - 1).bit_length(), 16)


def write_proof(leaves, h, path):
    """Writes the proof object; returns the Merkle root and the records."""
    c = 1 << h
    roots, records = [], []
    for at in range(0, len(leaves), c):
        r, rec = chunk_proof(leaves[at:at + c], h)
        roots.append(r)
        records.extend(rec)
    with open(path, "wb") as f:
        f.write(b"".join(roots))
        f.write(b"".join(records))
    return th(roots), records


def write_runs(rows_path, row_bytes, records, path):
    """FORMAT.md 7b, from its formula: row i, then record i, for every row."""
    with open(rows_path, "rb") as rows, open(path, "wb") as out:
        for rec in records:
            row = rows.read(row_bytes)
            assert len(row) == row_bytes
            out.write(row + rec)


# ----------------------------------------------------------- the source

def read_source(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    else:
        names = ["model.safetensors"]
    files, tensors = [], []
    for fi, name in enumerate(names):
        path = os.path.join(model_dir, name)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        base = 8 + n
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        files.append({"name": name, "path": path, "mm": mm})
        ts = []
        for tname, info in header.items():
            if tname == "__metadata__":
                continue
            b, e = info["data_offsets"]
            ts.append({"name": tname, "dtype": info["dtype"], "shape": info["shape"],
                       "file": fi, "begin": base + b, "end": base + e})
        tensors.extend(sorted(ts, key=lambda t: t["begin"]))
    return files, tensors


def tensor_bytes(files, t, first=0, count=None):
    mm = files[t["file"]]["mm"]
    if count is None:
        return mm[t["begin"]:t["end"]]
    row = t["shape"][1] * DTYPES[t["dtype"]][1]
    return mm[t["begin"] + first * row:t["begin"] + (first + count) * row]


def same_bytes(a, b, step=16 << 20):
    return len(a) == len(b) and all(
        np.array_equal(a[i:i + step], b[i:i + step]) for i in range(0, len(a), step))


# -------------------------------------------------------- header (3)

def str16(s):
    b = s.encode()
    return struct.pack("<H", len(b)) + b


def str32(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def encode_header(metadata, blocks):
    out = [struct.pack("<I", len(metadata))]
    for key in sorted(metadata, key=lambda k: k.encode()):
        kind, v = metadata[key]
        out.append(str16(key))
        if kind == "u64":
            out.append(b"\x01" + struct.pack("<Q", v))
        elif kind == "bool":
            out.append(b"\x02" + bytes([1 if v else 0]))
        elif kind == "str":
            out.append(b"\x03" + str32(v))
        else:
            out.append(b"\x04" + struct.pack("<I", len(v)) + b"".join(str32(s) for s in v))
    out.append(struct.pack("<I", len(blocks)))
    for b in blocks:
        out.append(str16(b["name"]))
        out.append(bytes([b["encoding"], DTYPES[b["dtype"]][0]]))
        out.append(struct.pack("<IB", b["flags"], len(b["shape"])))
        out.append(b"".join(struct.pack("<Q", d) for d in b["shape"]))
        if b["encoding"] == 0:
            out.append(struct.pack("<QQ", b["offset"], b["length"]) + b["sha256"])
        else:
            out.append(struct.pack("<I", b["target"]))
        out.append(bytes([len(b["columnar"])]))
        for d in b["columnar"]:
            out.append(bytes([DTYPES[d["dtype"]][0]]))
            inline = d.get("inline", False)
            stride = d["row_bytes"] + (32 * d["height"] if inline else 0)
            out.append(struct.pack("<QQQ", d["rows"], d["row_bytes"], d["rows"] * stride))
            out.append(d["sha256"] + str16(d["object"]))
            flags = d["flags"] | (INLINE_PROOF if inline else 0)
            out.append(bytes([flags, d["height"]]) + d["root"])
    return b"".join(out)


# ----------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", action="append", default=[], help="f32, f16 or bf16 (repeatable; default f32)")
    ap.add_argument("--tool", default="reference_pack.py", help="value of the gkq.tool key")
    ap.add_argument("--allow-lossy", action="store_true")
    ap.add_argument("--knot-holds-blocks", action="store_true",
                    help="the role blocks in the knot too, row files plain (version 3)")
    args = ap.parse_args()
    dtypes = [d.upper() for d in (args.dtype or ["f32"])]
    d0 = dtypes[0]
    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    files, tensors = read_source(args.model_dir)
    by_name = {t["name"]: t for t in tensors}
    embed = by_name["model.embed_tokens.weight"]
    lm = by_name.get("lm_head.weight")
    vocab, hidden = embed["shape"]
    tied = lm is None or same_bytes(tensor_bytes(files, lm), tensor_bytes(files, embed))
    if lm is None and not cfg.get("tie_word_embeddings", True):
        sys.exit("reference_pack: no lm_head.weight and tie_word_embeddings is false")
    lm_block = "lm_head.weight"
    roles = {embed["name"]: "token_embd"}
    if not tied:
        roles[lm["name"]] = "lm_head"

    os.makedirs(args.out_dir)
    written = []

    def create(name):
        p = os.path.join(args.out_dir, name)
        written.append(p)
        return open(p, "wb")

    # companion files
    companions = []
    for name in COMPANIONS:
        src = os.path.join(args.model_dir, name)
        if os.path.isfile(src):
            with open(src, "rb") as f:
                data = f.read()
            with create(name) as f:
                f.write(data)
            companions.append((name, hashlib.sha256(data).hexdigest()))

    # the block table (section 3.2), payload lengths and offsets
    blocks, embed_index = [], 0
    for t in tensors:
        if tied and lm is not None and t["name"] == lm["name"]:
            continue
        b = {"name": t["name"], "encoding": 0, "dtype": t["dtype"], "flags": 0,
             "shape": t["shape"], "sha256": b"\0" * 32, "columnar": [], "src": t, "offset": 0}
        if t["name"] in roles:
            rows, cols = t["shape"]
            b["dtype"], b["flags"] = d0, COLUMNAR_ELIGIBLE
            for d in dtypes:
                rb = cols * DTYPES[d][1]
                b["columnar"].append({
                    "dtype": d, "rows": rows, "row_bytes": rb, "sha256": b"\0" * 32,
                    "object": f"{roles[t['name']]}.{d.lower()}.rows", "flags": 0,
                    "height": proof_height(rows, rb), "root": b"\0" * 32})
            if t["name"] == embed["name"]:
                embed_index = len(blocks)
        n = 1
        for d in t["shape"]:
            n *= d
        b["length"] = n * DTYPES[b["dtype"]][1]
        blocks.append(b)
    if tied:
        e = blocks[embed_index]
        blocks.append({"name": lm_block, "encoding": 2, "dtype": e["dtype"], "flags": e["flags"],
                       "shape": e["shape"], "target": embed_index, "columnar": []})
    metadata = {
        "gkq.tool": ("str", args.tool),
        "model.architecture": ("str", (cfg.get("architectures") or [cfg["model_type"]])[0]),
        "model.type": ("str", cfg["model_type"]),
        "model.vocab_size": ("u64", vocab),
        "model.hidden_size": ("u64", hidden),
        "role.token_embd": ("str", embed["name"]),
        "model.tie_word_embeddings": ("bool", tied),
        "role.lm_head": ("str", lm_block if tied else lm["name"]),
        "source.files": ("list", [f["name"] for f in files]),
        "source.sha256": ("list", ["0" * 64] * len(files)),
    }
    if companions:
        metadata["package.files"] = ("list", [c[0] for c in companions])
        metadata["package.sha256"] = ("list", [c[1] for c in companions])
    # gkq-pack's choice: the narrowest row file of each block that is
    # certainly exact (the payload's dtype, or two dtypes that both hold
    # every source value; the first on a tie), when it has path records
    def holds(d, src):
        return d == src or (d == "F32" and src in ("F16", "BF16"))

    narrowest = []
    for b in blocks:
        if not b["columnar"]:
            continue
        src = b["src"]["dtype"]
        sure = [d for d in b["columnar"]
                if d["dtype"] == b["dtype"] or (holds(d["dtype"], src) and holds(b["dtype"], src))]
        narrowest.append(min(sure, key=lambda d: d["row_bytes"]))
    runs = sorted(d["object"] for d in narrowest if d["height"] > 0)
    # 7e: a block with a row file of its own dtype is stored there alone;
    # that row file takes its runs object's place, its records inline
    version = VERSION
    if not args.knot_holds_blocks:
        for b in blocks:
            home = [d for d in b["columnar"] if d["dtype"] == b["dtype"]]
            if not home:
                continue
            if home[0]["object"] in runs:
                runs.remove(home[0]["object"])
                home[0]["inline"] = True
            b["flags"] |= IN_ROW_FILE
            version = VERSION_5
    if runs:
        metadata["columnar.runs"] = ("list", runs)
    header_len = len(encode_header(metadata, blocks))
    cursor = data_offset = align_up(72 + header_len)
    for b in blocks:
        if b["encoding"] == 0 and not b["flags"] & IN_ROW_FILE:
            b["offset"] = align_up(cursor)
            cursor = b["offset"] + b["length"]
    file_len = cursor

    # payloads, row files and proofs
    knot = create("model.knot")
    for b in blocks:
        if b["encoding"] != 0:
            continue
        t = b["src"]
        in_knot = not b["flags"] & IN_ROW_FILE
        if in_knot:
            knot.seek(b["offset"])
        h = hashlib.sha256()
        if not b["columnar"]:
            data = tensor_bytes(files, t)
            h.update(data)
            knot.write(data)
            b["sha256"] = h.digest()
            continue
        rows, cols = t["shape"]
        outs = []
        for d in b["columnar"]:
            outs.append({"d": d, "f": create(d["object"]), "h": hashlib.sha256(), "leaves": [],
                         "src_exact": True, "blk_exact": True})
        sdt = t["dtype"]
        per_step = max(1, STEP_BYTES // (cols * 4))
        for first in range(0, rows, per_step):
            n = min(per_step, rows - first)
            src = np.frombuffer(tensor_bytes(files, t, first, n), dtype=uint_of(sdt))
            blk = cast(src, sdt, d0, t["name"], first, cols, args.allow_lossy)
            bb = blk.tobytes()
            h.update(bb)
            if in_knot:
                knot.write(bb)
            for o in outs:
                d = o["d"]
                v = cast(blk, d0, d["dtype"], t["name"], first, cols, args.allow_lossy)
                vb = v.tobytes()
                if o["blk_exact"]:
                    o["blk_exact"] = np.array_equal(from_f32_bits(to_f32_bits(v, d["dtype"]), d0), blk)
                if o["src_exact"]:
                    o["src_exact"] = np.array_equal(from_f32_bits(to_f32_bits(v, d["dtype"]), sdt), src)
                o["h"].update(vb)
                o["f"].write(vb)
                rb = d["row_bytes"]
                o["leaves"].extend(sha(b"\x00" + vb[i:i + rb]) for i in range(0, len(vb), rb))
        b["sha256"] = h.digest()
        for o in outs:
            d = o["d"]
            o["f"].close()
            d["sha256"] = o["h"].digest()
            d["flags"] = (SOURCE_EXACT if o["src_exact"] else 0) | (BLOCK_EXACT if o["blk_exact"] else 0)
            proof = os.path.join(args.out_dir, d["object"] + ".proof")
            written.append(proof)
            d["root"], records = write_proof(o["leaves"], d["height"], proof)
            if d.get("inline"):
                # 7e: the row file with each record after its row, the
                # proof object its chunk table alone
                rows_path = os.path.join(args.out_dir, d["object"])
                write_runs(rows_path, d["row_bytes"], records, rows_path + ".tmp")
                os.replace(rows_path + ".tmp", rows_path)
                with open(rows_path, "rb") as f:
                    d["sha256"] = hashlib.sha256(f.read()).digest()
                chunks = -(-d["rows"] // (1 << d["height"]))
                os.truncate(proof, 32 * chunks)
            if d["object"] in runs:
                runs_path = os.path.join(args.out_dir, d["object"] + ".runs")
                written.append(runs_path)
                rows_path = os.path.join(args.out_dir, d["object"])
                write_runs(rows_path, d["row_bytes"], records, runs_path)

    # source digests (whole files), then the header and the preamble
    digests = []
    for f in files:
        h = hashlib.sha256()
        with open(f["path"], "rb") as src:
            while chunk := src.read(8 << 20):
                h.update(chunk)
        digests.append(h.hexdigest())
    metadata["source.sha256"] = ("list", digests)
    header = encode_header(metadata, blocks)
    assert len(header) == header_len
    pre = MAGIC + struct.pack("<IIQQQ", version, 0, header_len, data_offset, file_len)
    pre += sha(pre + header)
    knot.seek(0)
    knot.write(pre + header)
    knot.seek(file_len)
    knot.truncate(file_len)
    knot.close()

    for p in written:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    fd = os.open(args.out_dir, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    print(f"knot id {pre[40:72].hex()}")


if __name__ == "__main__":
    main()
