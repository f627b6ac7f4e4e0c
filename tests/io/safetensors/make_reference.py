#!/usr/bin/env python3
"""Writes safetensors files with the reference implementation (PyPI safetensors, on numpy) and
reference.json, what that implementation reports about each file, for
safetensors_reference_test.cpp to compare with kshard's reader.

    python3 make_reference.py OUT_DIR

reference.json: {"files": [{"file", "file_size", "header_length", "metadata" (a dict, or null
when the file has none), "tensors": [{"name", "dtype", "shape", "begin", "end"}]}]}, tensors in
offset order, ties in header order. Names, dtypes, shapes and metadata come from safe_open; the offsets from the
header as Python's json module reads it, and are checked here: each tensor's bytes in the file
must be exactly what safe_open returns for it.
"""

import json
import pathlib
import struct
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file


def files():
    """File name -> (tensors, metadata). BF16 and F8 have no numpy type; the C++ tests cover
    them with hand-written headers."""
    rng = np.random.default_rng(13)
    mixed = {
        "bool": np.array([True, False, True]),
        "u8": np.arange(5, dtype=np.uint8),
        "i8": np.array([-3, 4], dtype=np.int8),
        "i16": np.array([[-1, 2], [3, -4]], dtype=np.int16),
        "u16": np.array([65535], dtype=np.uint16),
        "f16": rng.standard_normal((3, 2)).astype(np.float16),
        "i32": np.array([-(2**31)], dtype=np.int32),
        "u32": np.array([2**32 - 1, 7], dtype=np.uint32),
        "f32": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "f64": np.array([np.pi]),
        "i64": np.array(2**40, dtype=np.int64),  # a scalar: shape []
        "u64": np.array([2**64 - 1], dtype=np.uint64),
    }
    empty = {
        "a.empty": np.zeros((0,), np.float32),
        "b.weight": np.ones((4, 2), np.float32),
        "c.empty": np.zeros((3, 0, 2), np.int64),
        "d.bias": np.ones((3,), np.uint8),
    }
    model = {
        "model.embed_tokens.weight": rng.standard_normal((512, 64)).astype(np.float32),
        "lm_head.weight": rng.standard_normal((512, 64)).astype(np.float16),
        "position_ids": np.arange(128, dtype=np.int64).reshape(1, 128),
        "\u03b5.bias": np.zeros((64,), np.float32),
    }
    return {
        "mixed.safetensors": (mixed, {"format": "np"}),
        "empty_tensors.safetensors": (empty, None),
        "no_tensors.safetensors": ({}, None),
        "metadata_only.safetensors": ({}, {"a": "1", "b": "two", "\u00e9": "caf\u00e9 \"x\""}),
        "model.safetensors": (model, {"format": "pt", "step": "1200"}),
    }


def describe(path):
    """What safe_open reports about the file at `path`, with offsets checked against its data."""
    raw = path.read_bytes()
    (header_length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_length])
    data = raw[8 + header_length :]
    tensors = []
    with safe_open(str(path), framework="np") as f:
        metadata = f.metadata()
        for name in f.keys():
            view = f.get_slice(name)
            begin, end = header[name]["data_offsets"]
            if data[begin:end] != f.get_tensor(name).tobytes():
                sys.exit(f"{path}: the bytes at {name}'s offsets are not its data")
            tensors.append({"name": name, "dtype": view.get_dtype(),
                            "shape": list(view.get_shape()), "begin": begin, "end": end})
    # Empty tensors may share an offset: those keep their header order, as kshard's reader does.
    position = {name: index for index, name in enumerate(header)}
    tensors.sort(key=lambda t: (t["begin"], t["end"], position[t["name"]]))
    return {"file": path.name, "file_size": len(raw), "header_length": header_length,
            "metadata": metadata, "tensors": tensors}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    described = []
    for name, (tensors, metadata) in files().items():
        save_file(tensors, str(out / name), metadata=metadata)
        described.append(describe(out / name))
    (out / "reference.json").write_text(json.dumps({"files": described}, indent=1))
    print(f"wrote {len(described)} safetensors files and reference.json to {out}")


if __name__ == "__main__":
    main()
