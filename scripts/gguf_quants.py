#!/usr/bin/env python3
"""The independent reference for ggml's block types: gguf-py's `gguf.quants`
(PyPI `gguf`, from llama.cpp), run on raw little-endian files.

  gguf_quants.py quantize TYPE VALUES.f32 OUT.bin     f32 values (rows of COLS) -> blocks
  gguf_quants.py dequantize TYPE BLOCKS.bin OUT.f32   blocks -> f32 values
  gguf_quants.py batch JOBS.txt                       one "OP TYPE IN OUT" per line

TYPE is a ggml type name (Q8_0, Q4_0, Q4_K, ...). Quantization exists in
gguf-py for the 32-element types only; dequantization for all of them.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, quants


def main() -> None:
    if sys.argv[1] == "batch":
        with open(sys.argv[2], encoding="utf-8") as jobs:
            for line in jobs:
                if line.strip():
                    run(*line.split())
    else:
        run(*sys.argv[1:5])


def run(op: str, name: str, src: str, dst: str) -> None:
    qtype = GGMLQuantizationType[name.upper()]
    if op == "quantize":
        x = np.fromfile(src, dtype=np.float32)
        blocks = quants.quantize(x.reshape(1, -1), qtype)
        blocks.tofile(dst)
    elif op == "dequantize":
        b = np.fromfile(src, dtype=np.uint8)
        y = quants.dequantize(b.reshape(1, -1), qtype)
        y.astype(np.float32).tofile(dst)
    else:
        sys.exit(f"unknown operation {op!r}")


if __name__ == "__main__":
    main()
