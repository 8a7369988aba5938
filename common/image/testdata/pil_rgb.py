#!/usr/bin/env python3
"""Decodes each image file named on the command line the way vLLM hands images to a model: Pillow opens
it, then the conversion to RGB of vllm/multimodal/media/image.py (ImageMediaIO._convert_image_mode with
image_mode "RGB"): RGBA is pasted on a white background through its alpha band, any other mode goes
through Image.convert("RGB"). Writes, per file, a line "W H" and then W*H*3 bytes of RGB."""
import sys

from PIL import Image


def to_rgb(image):
    if image.mode == "RGB":
        return image
    if image.mode == "RGBA":
        out = Image.new("RGB", image.size, (255, 255, 255))
        out.paste(image, mask=image.split()[3])
        return out
    return image.convert("RGB")


for path in sys.argv[1:]:
    image = to_rgb(Image.open(path))
    sys.stdout.buffer.write(b"%d %d\n" % image.size)
    sys.stdout.buffer.write(image.tobytes())
