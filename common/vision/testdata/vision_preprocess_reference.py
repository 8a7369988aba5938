#!/usr/bin/env python3
"""An independent implementation of DeepSeek-V4-Flash-Vision's image preprocessing, written from the
description of vLLM's port (vllm/models/deepseek_v4/common/mm_preprocess.py: grid_tokens,
solve_resize_ratio, safe_resize, load_image, build_image_block) with Pillow doing the resizing and padding
the way the reference does (Image.resize / ImageOps.pad) and numpy the tensor reshapes. Used at test time
by common/vision/vision_preprocess_test.cc.

  grid  W H [W H ...]        -> one line per size: best_w best_h vit_h vit_w llm_h llm_w tokens
  patches W H [W H ...]      -> per size: the grid line, then float32 patches [vit_h*vit_w, 3, p, p]
  block LLM_H LLM_W START ... -> per triple: "types..." line and "perm..." line
The test images are the pattern image(W, H) below (the C++ test builds the same pixels).
"""
import math
import sys

import numpy as np
from PIL import Image, ImageOps

P, R, MAX_N_TOKEN, MIN_PIXELS, MAX_WH_RATIO = 14, 3, 384, 147456, 8
IMAGE_START, IMAGE_PAD, IMAGE, IMAGE_NEW_LINE, IMAGE_END = range(5)


def pattern(w, h):
    y, x = np.mgrid[0:h, 0:w]
    planes = [(x * 7 + y * 13 + c * 50 + (x * y) % 11 + ((x // 5 + y // 3) % 2) * 90) % 256 for c in range(3)]
    return np.stack(planes, axis=-1).astype(np.uint8)


def tokens_of(best_h, best_w):
    n_h = math.ceil((best_h // P) / R)
    n_w = math.ceil((best_w // P) / R)
    n = n_h * (n_w + 1) + 2 + (n_w + 1 if n_h % 2 else 0)
    n += (((n_h + 1) // 2) * (n_w + 1)) % 2 * 2
    return n_h, n_w, n


def shrink(height, width, budget):
    ratio = height / width
    wf = math.sqrt((budget - 2) / ratio + 0.25) - 0.5
    hf = wf * ratio
    if wf < 1.0:
        mh = (budget - 2) // 2
        mh -= mh % 2
        return mh * P * R, P * R
    if hf < 2.0:
        mw = (budget - 2) // 2 - 1
        return 2 * P * R, mw * P * R
    mw, mh = math.floor(wf), math.floor(hf)
    mh -= mh % 2
    beta = min(mw * P * R / width, mh * P * R / height)
    return math.floor(height * beta / P) * P, math.floor(width * beta / P) * P


def grid(w0, h0):
    width, height = w0, h0
    if width > height * MAX_WH_RATIO:
        width = height * MAX_WH_RATIO
    if 0 < width * height < MIN_PIXELS:
        s = (MIN_PIXELS / (width * height)) ** 0.5
        width, height = int(width * s), int(height * s)
    bh, bw = math.ceil(height / P) * P, math.ceil(width / P) * P
    limit = MAX_N_TOKEN - 3
    budget = limit
    while tokens_of(bh, bw)[2] > limit:
        bh, bw = shrink(height, width, budget)
        budget -= 1
    n_h, n_w, n = tokens_of(bh, bw)
    return bw, bh, bh // P, bw // P, n_h, n_w, n


def to_bf16(x):
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def patches(w0, h0):
    bw, bh, vh, vw, *_ = grid(w0, h0)
    image = Image.fromarray(pattern(w0, h0), "RGB")
    if image.width >= MAX_WH_RATIO * image.height:
        image = image.resize((bw, bh))
    else:
        image = ImageOps.pad(image, (bw, bh), color=(127, 127, 127))
    x = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / np.float32(255)
    x = to_bf16((x - np.float32(0.5)) / np.float32(0.5))
    return x.reshape(3, vh, P, vw, P).transpose(1, 3, 0, 2, 4).reshape(vh * vw, 3, P, P)


def block(n_h, n_w, start):
    pad = 3 - start % 4
    rows = n_h + n_h % 2
    row_len = n_w + 1
    types = np.array(([IMAGE] * n_w + [IMAGE_NEW_LINE]) * n_h + [IMAGE_PAD] * (row_len * (n_h % 2)))
    order = np.arange(rows * row_len).reshape(rows // 2, 2, row_len).transpose(0, 2, 1).reshape(-1)
    idx = np.full((rows, row_len), -1)
    idx[:n_h, :n_w] = np.arange(n_h * n_w).reshape(n_h, n_w)
    perm = idx.reshape(-1)[order]
    perm = perm[perm >= 0]
    tail = (rows // 2 * row_len) % 2 * 2
    out = [IMAGE_PAD] * pad + [IMAGE_START] + types[order].tolist() + [IMAGE_PAD] * tail + [IMAGE_END]
    return out, perm.tolist()


def main():
    mode, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    out = sys.stdout.buffer
    if mode == "grid":
        for w, h in zip(args[0::2], args[1::2]):
            out.write((" ".join(map(str, grid(w, h))) + "\n").encode())
    elif mode == "patches":
        for w, h in zip(args[0::2], args[1::2]):
            out.write((" ".join(map(str, grid(w, h))) + "\n").encode())
            out.write(np.ascontiguousarray(patches(w, h), dtype=np.float32).tobytes())
    elif mode == "block":
        for n_h, n_w, start in zip(args[0::3], args[1::3], args[2::3]):
            types, perm = block(n_h, n_w, start)
            out.write((" ".join(map(str, types)) + "\n" + " ".join(map(str, perm)) + "\n").encode())


if __name__ == "__main__":
    main()
