"""Shared by make_damaged.py and check_repair.py: a small safetensors header reader and writer
of our own (independent of kshard's and of the reference package), bfloat16 conversion,
FNV-1a 64 and the checkpoint layout rules (single file or sharded folder with an index).

The reference implementation (PyPI safetensors) is used next to these, never instead of them:
the tests compare what it reads with what our own parser finds at the header's offsets.
"""

import ctypes
import hashlib
import json
import mmap
import os
import pathlib
import struct

import numpy as np

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
EMBED = "embeddings.word_embeddings.weight"
LM_HEAD = "lm_head.weight"

DTYPE_SIZE = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "U8": 1}
# numpy dtypes of the raw elements (BF16 as its 16-bit patterns)
DTYPE_NUMPY = {"F64": np.float64, "F32": np.float32, "BF16": np.uint16, "F16": np.float16,
               "I64": np.int64, "I32": np.int32, "U8": np.uint8}


# ---------------------------------------------------------------------------------------------
# Our own safetensors reader and writer.

class Header:
    """A parsed safetensors header: header_length N, data_offset 8 + N, tensors (name ->
    {"dtype", "shape", "begin", "end"} relative to the data section), metadata, file size."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        with open(self.path, "rb") as f:
            (self.header_length,) = struct.unpack("<Q", f.read(8))
            raw = f.read(self.header_length)
        self.data_offset = 8 + self.header_length
        self.file_size = self.path.stat().st_size
        parsed = json.loads(raw.decode("utf-8"))
        self.metadata = parsed.pop("__metadata__", None)
        self.tensors = {}
        for name, info in parsed.items():
            begin, end = info["data_offsets"]
            self.tensors[name] = {"dtype": info["dtype"], "shape": list(info["shape"]),
                                  "begin": begin, "end": end}

    def file_range(self, name):
        """[begin, end) of tensor `name` in the file."""
        t = self.tensors[name]
        return self.data_offset + t["begin"], self.data_offset + t["end"]

    def row_bytes(self, name):
        t = self.tensors[name]
        return int(np.prod(t["shape"][1:], dtype=np.int64)) * DTYPE_SIZE[t["dtype"]]


def read_tensor(path, header, name, data=None):
    """Tensor `name` as a numpy array of its raw element type (BF16: uint16 bit patterns), read
    at the offsets our own parser found."""
    t = header.tensors[name]
    begin, end = header.file_range(name)
    if data is None:
        with open(path, "rb") as f:
            f.seek(begin)
            raw = f.read(end - begin)
    else:
        raw = data[begin:end]
    return np.frombuffer(raw, dtype=DTYPE_NUMPY[t["dtype"]]).reshape(t["shape"])


def write_safetensors(path, tensors, metadata=None, header_mod=None):
    """Writes `tensors` (list of (name, dtype string, numpy array of raw elements)) in the
    given order. The header is compact JSON; `header_mod(json_bytes) -> bytes` may change it
    (our tests use it to leave the data section unaligned). Returns the header length."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, array in tensors:
        n = array.nbytes
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if header_mod is not None:
        text = header_mod(text)
    else:
        text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, array in tensors:
            f.write(np.ascontiguousarray(array).tobytes())  # little-endian machines only
    return len(text)


# ---------------------------------------------------------------------------------------------
# bfloat16 as uint16 bit patterns.

def f32_to_bf16(values):
    """float32 -> bfloat16 bit patterns, round to nearest even; NaN stays a quiet NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    # No overflow in 32 bits: only NaN patterns come within 0x8000 of 2^32, and they are redone.
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1)).astype(np.uint32)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def as_float64(array, dtype):
    """Raw elements -> float64 values."""
    if dtype == "BF16":
        return bf16_to_f32(array).astype(np.float64)
    return np.asarray(array, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# FNV-1a 64 over raw bytes: a compiled helper when run.sh built one (KSHARD_REALDATA_FNV_LIB),
# else pure Python (correct, but some 5-10 s per 100 MB: the whole run then takes minutes).

FNV_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_fnv_lib = None


def _lib():
    global _fnv_lib
    if _fnv_lib is None:
        path = os.environ.get("KSHARD_REALDATA_FNV_LIB")
        _fnv_lib = False
        if path and os.path.exists(path):
            lib = ctypes.CDLL(path)
            lib.kshard_realdata_fnv1a64.restype = ctypes.c_uint64
            lib.kshard_realdata_fnv1a64.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                                    ctypes.c_uint64]
            _fnv_lib = lib
    return _fnv_lib


def fnv1a64(data):
    """FNV-1a 64 of a bytes-like object (a numpy uint8 array is passed without a copy)."""
    array = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    lib = _lib()
    if lib:
        array = np.ascontiguousarray(array)
        return int(lib.kshard_realdata_fnv1a64(array.ctypes.data, array.size, FNV_BASIS))
    h = FNV_BASIS
    mask = 0xFFFFFFFFFFFFFFFF
    for b in array.tobytes():
        h = ((h ^ b) * FNV_PRIME) & mask
    return h


def fnv_text(value):
    return "fnv1a64:%016x" % value


def tensor_hashes(files):
    """{tensor name: "fnv1a64:%016x"} over every tensor of the given weights files."""
    hashes = {}
    for path in files:
        header = Header(path)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            whole = np.frombuffer(m, dtype=np.uint8)
            for name in header.tensors:
                begin, end = header.file_range(name)
                hashes[name] = fnv_text(fnv1a64(whole[begin:end]))
            del whole
    return hashes


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Checkpoint layout.

def weights_files(path):
    """{file name: path} of the weights of a checkpoint: a .safetensors file, or a folder with
    an index (its weight_map's files) or model.safetensors."""
    path = pathlib.Path(path)
    if path.is_file():
        return {path.name: path}
    index = path / INDEX_NAME
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {name: path / name for name in names}
    return {SINGLE_NAME: path / SINGLE_NAME}


def file_of(files, tensor):
    """The path (of `files`, a weights_files dict) whose header holds `tensor`."""
    for name, path in files.items():
        if tensor in Header(path).tensors:
            return name, path
    raise KeyError(tensor)
