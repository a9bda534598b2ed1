#!/usr/bin/env python3
"""Prints what gguf-py's GGUFReader reads from GGUF files, as one JSON
object: the version, every metadata key with its type and value, and every
tensor with its type, shape (outermost first) and the SHA-256 of its bytes.
The test suite's independent GGUF reader (PyPI gguf, from llama.cpp).

  gguf_dump.py FILE.gguf [FILE.gguf ...]     shards: tensors of all, metadata of the first
"""
import hashlib
import json
import sys

from gguf import GGUFReader


def main() -> None:
    out = {"tensors": []}
    for k, path in enumerate(sys.argv[1:]):
        r = GGUFReader(path)
        if k == 0:
            out["metadata"] = {}
            for name, field in r.fields.items():
                if name.startswith("GGUF."):
                    if name == "GGUF.version":
                        out["version"] = int(field.contents())
                    continue
                types = [t.name for t in field.types]
                value = field.contents()
                out["metadata"][name] = {"type": types, "value": value}
        for t in r.tensors:
            out["tensors"].append(
                {
                    "name": t.name,
                    "type": t.tensor_type.name,
                    "shape": [int(d) for d in reversed(t.shape.tolist())],
                    "sha256": hashlib.sha256(t.data.tobytes()).hexdigest(),
                    "bytes": int(t.n_bytes),
                }
            )
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
