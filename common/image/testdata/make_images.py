#!/usr/bin/env python3
"""Writes the small test images in this folder (run once; the outputs are committed).

Most are written by Pillow (python3-pil); the PNG variants Pillow cannot write (16-bit RGB, Adam7
interlacing, 2-bit grey) come from the tiny PNG writer below. Content is deterministic: gradients, edges
and a pseudo-random pattern, so a decoder that gets any pixel wrong shows it.

    python3 common/image/testdata/make_images.py common/image/testdata
"""
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

W, H = 37, 23


def pattern(w=W, h=H, channels=3):
    y, x = np.mgrid[0:h, 0:w]
    noise = (x * 7 + y * 13 + (x * y) % 11) % 97
    planes = [
        (x * 255 // max(w - 1, 1) + noise) % 256,
        (y * 255 // max(h - 1, 1) + 3 * noise) % 256,
        ((x // 3 + y // 5) % 2) * 200 + noise // 2,
        (x * 9 + y * 17) % 256,  # alpha when there are 4 channels: every value 0..255 appears
    ]
    return np.stack(planes[:channels], axis=-1).astype(np.uint8)


def png_chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def write_png(path, rows_fn, w, h, bit_depth, color_type, interlace=False):
    """rows_fn(x0, dx, y0, dy) -> list of raw scanline bytes (unfiltered) of that sub-image."""
    raw = b""
    if interlace:
        passes = [(0, 8, 0, 8), (4, 8, 0, 8), (0, 4, 4, 8), (2, 4, 0, 4), (0, 2, 2, 4), (1, 2, 0, 2), (0, 1, 1, 2)]
        for x0, dx, y0, dy in passes:
            if x0 >= w or y0 >= h:
                continue
            for line in rows_fn(x0, dx, y0, dy):
                raw += b"\x00" + line
    else:
        for line in rows_fn(0, 1, 0, 1):
            raw += b"\x00" + line
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw, 9))
    Path(path).write_bytes(data + png_chunk(b"IEND", b""))


def main(out):
    out = Path(out)
    rgb = pattern()
    rgba = pattern(channels=4)
    Image.fromarray(rgb, "RGB").save(out / "rgb.png")
    Image.fromarray(rgba, "RGBA").save(out / "rgba.png")
    Image.fromarray(rgb[:, :, 0], "L").save(out / "gray.png")
    Image.fromarray(np.stack([rgb[:, :, 0], rgba[:, :, 3]], -1), "LA").save(out / "gray_alpha.png")
    pal = Image.fromarray(rgb, "RGB").quantize(colors=50)
    pal.info["transparency"] = 3
    pal.save(out / "palette_trns.png", transparency=3)

    # 16-bit RGB: high byte = the pattern, low byte = noise (must not leak into the 8-bit result).
    rgb16 = rgb.astype(np.uint16) * 256 + (pattern()[:, :, ::-1].astype(np.uint16))

    def rows16(x0, dx, y0, dy):
        return [rgb16[y, x0::dx].astype(">u2").tobytes() for y in range(y0, H, dy)]

    write_png(out / "rgb16.png", rows16, W, H, 16, 2)

    def rows8(x0, dx, y0, dy):
        return [rgb[y, x0::dx].tobytes() for y in range(y0, H, dy)]

    write_png(out / "rgb_interlaced.png", rows8, W, H, 8, 2, interlace=True)

    gray2 = (rgb[:, :, 1] >> 6).astype(np.uint8)  # 2-bit samples

    def rows2(x0, dx, y0, dy):
        lines = []
        for y in range(y0, H, dy):
            v = gray2[y, x0::dx]
            v = np.concatenate([v, np.zeros((-len(v)) % 4, np.uint8)])
            lines.append(bytes((v[0::4] << 6) | (v[1::4] << 4) | (v[2::4] << 2) | v[3::4]))
        return lines

    write_png(out / "gray2.png", rows2, W, H, 2, 0)

    Image.fromarray(rgb, "RGB").save(out / "rgb.jpg", quality=90)
    Image.fromarray(rgb, "RGB").save(out / "progressive.jpg", quality=85, progressive=True)
    Image.fromarray(rgb, "RGB").save(out / "rgb444.jpg", quality=95, subsampling=0)
    Image.fromarray(rgb[:, :, 0], "L").save(out / "gray.jpg", quality=90)
    Image.fromarray(rgba, "RGBA").convert("CMYK").save(out / "cmyk.jpg", quality=90)
    Image.fromarray(rgb, "RGB").save(out / "lossy.webp", quality=80)
    Image.fromarray(rgb, "RGB").save(out / "lossless.webp", lossless=True)
    Image.fromarray(rgba, "RGBA").save(out / "rgba_lossless.webp", lossless=True)
    Image.fromarray(rgba, "RGBA").save(out / "rgba_lossy.webp", quality=80)
    # A larger photo-like image for the preprocessing tests (resize and pad paths).
    big = pattern(300, 200)
    Image.fromarray(big, "RGB").save(out / "wide.png")


if __name__ == "__main__":
    main(sys.argv[1])
