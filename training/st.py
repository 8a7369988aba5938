"""Minimal safetensors reader/writer on torch alone (no safetensors package needed)."""
import json
import struct

import torch

_DT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I64": torch.int64,
       "I32": torch.int32, "I16": torch.int16, "U8": torch.uint8, "I8": torch.int8, "F64": torch.float64}
_DT_INV = {v: k for k, v in _DT.items()}
try:
    _DT["F8_E4M3"] = torch.float8_e4m3fn
    _DT_INV[torch.float8_e4m3fn] = "F8_E4M3"
except AttributeError:
    pass


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        buf = bytearray(data[b:e])
        t = torch.frombuffer(buf, dtype=_DT[v["dtype"]]) if e > b else torch.empty(0, dtype=_DT[v["dtype"]])
        out[k] = t.reshape(v["shape"]).clone()
    return out


def save(path, tensors, metadata=None, raw_dtypes=None):
    """raw_dtypes: {name: (dtype string, bytes)} for dtypes torch lacks (e.g. F8_E4M3 on old torch)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    items = [(k, v) for k, v in tensors.items()]
    for k, v in items:
        if raw_dtypes and k in raw_dtypes:
            dt, b = raw_dtypes[k]
            shape = list(v)
        else:
            v = v.contiguous()
            dt = _DT_INV[v.dtype]
            b = v.view(torch.uint8).numpy().tobytes() if v.numel() else b""
            shape = list(v.shape)
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
