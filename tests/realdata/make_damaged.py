#!/usr/bin/env python3
"""Builds damaged copies of a real checkpoint (all-MiniLM-L6-v2) for kshard-repair's real-data
tests, with numpy, the reference safetensors writer (PyPI) and, for what it cannot write, our
own writer (realdata_common.write_safetensors).

    python3 make_damaged.py MODEL_DIR OUT_DIR

OUT_DIR/NAME/ is a checkpoint folder (config.json + weights) and OUT_DIR/NAME.manifest.json
says what was done to it. The copies:

  f32        F32 as shipped; zero, 1e-9-scaled, NaN and Inf rows (whole rows and single
             elements), on the Shard(0) chunk boundaries of 1-4 ranks (torch.chunk: chunk =
             ceil(V / n)) and inside; the pad row 0 zeroed (to be kept, not repaired)
  bf16       every F32 tensor converted to BF16 (round to nearest even), damaged likewise
  lmhead     F32 plus an untied, healthy synthetic LM head lm_head.weight = E @ (0.7 Q), Q a
             fixed random orthogonal matrix; config tie_word_embeddings false
  unaligned  F32 written by our own writer with an odd-length metadata string and a header
             length that is not a multiple of 8 (data section unaligned)
  sharded    two files (model-0000{1,2}-of-00002.safetensors) with an index; the embedding in
             the second file
  f16        every F32 tensor converted to F16 by numpy (`model.half()`), damaged likewise

Manifest: {"name", "dtype", "embed", "embed_file", "lm_head", "strategy", "direction_from",
"pad_id", "kept_ids", "damaged": [{"id", "kind", "column"}], "damaged_ids", "weights_files",
"sha256": {file: hex}, "header_length": {file: N}, "rtol"}.
"""

import json
import pathlib
import shutil
import sys

import numpy as np
import safetensors
from safetensors.numpy import load_file, save_file

from realdata_common import (EMBED, INDEX_NAME, LM_HEAD, SINGLE_NAME, Header, f32_to_bf16,
                             read_tensor, sha256, write_safetensors)

PAD_ID = 0
KINDS = ["zero", "tiny", "nan", "inf", "nan_element", "inf_element"]
# Column chunk boundaries of Shard(1) at 2, 3 and 4 ranks (384 columns): single bad elements
# sit on them.
ELEMENT_COLUMNS = [191, 192, 127, 128, 95, 96, 255, 256, 287, 288]


def boundary_rows(vocab):
    """Rows on each side of the Shard(0) chunk boundaries at 1-4 ranks, row 1 and the last."""
    ids = {1, vocab - 1}
    for n in (1, 2, 3, 4):
        chunk = -(-vocab // n)
        for k in range(1, n):
            ids |= {k * chunk - 1, k * chunk}
    return ids


def damage_plan(vocab, seed, kind_offset):
    """[(id, kind, column)] for one copy: the boundary rows and three random inner rows."""
    ids = boundary_rows(vocab)
    rng = np.random.default_rng(seed)
    while len(ids) < len(boundary_rows(vocab)) + 3:
        candidate = int(rng.integers(2, vocab - 2))
        if candidate not in ids:
            ids.add(candidate)
    ids.discard(PAD_ID)
    plan = []
    for k, row in enumerate(sorted(ids)):
        kind = KINDS[(k + kind_offset) % len(KINDS)]
        column = ELEMENT_COLUMNS[k % len(ELEMENT_COLUMNS)] if kind.endswith("_element") else None
        plan.append((row, kind, column))
    return plan


def damaged_row(row, kind, column):
    """The float32 row `row` damaged as `kind`."""
    out = np.array(row, dtype=np.float32, copy=True)
    if kind == "zero":
        out[:] = 0
    elif kind == "tiny":
        out = (row.astype(np.float64) * 1e-9).astype(np.float32)
    elif kind == "nan":
        out[:] = np.nan
    elif kind == "inf":
        out[:] = np.inf
        out[1::2] = -np.inf
    elif kind == "nan_element":
        out[column] = np.nan
    elif kind == "inf_element":
        out[column] = -np.inf
    else:
        raise ValueError(kind)
    return out


def damage(embed, plan):
    """A damaged float32 copy of `embed`: the plan applied and the pad row zeroed."""
    out = np.array(embed, dtype=np.float32, copy=True)
    for row, kind, column in plan:
        out[row] = damaged_row(embed[row], kind, column)
    out[PAD_ID] = 0
    return out


def reference_serialize_file(tensors, path, metadata):
    """The reference writer for raw tensors [(name, dtype name as the reference spells it
    ("bfloat16", "int64"), numpy array)]: TensorSpec (safetensors >= 0.6) or dicts (older)."""
    spec = getattr(safetensors, "TensorSpec", None)
    flat = {}
    for name, dtype, array in tensors:
        array = np.ascontiguousarray(array)
        if spec is not None:
            flat[name] = spec(dtype=dtype, shape=list(array.shape), data_ptr=array.ctypes.data,
                              data_len=array.nbytes)
        else:
            flat[name] = {"dtype": dtype, "shape": list(array.shape), "data": array.tobytes()}
    keep_alive = [array for _, _, array in tensors]
    safetensors.serialize_file(flat, str(path), metadata=metadata)
    del keep_alive


def write_manifest(out_dir, name, folder, plan, dtype, lm_head, extra=None):
    files = {}
    index = folder / INDEX_NAME
    if index.exists():
        for file in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            files[file] = folder / file
    else:
        files[SINGLE_NAME] = folder / SINGLE_NAME
    embed_file = next(f for f, p in files.items() if EMBED in Header(p).tensors)
    manifest = {
        "name": name,
        "dtype": dtype,
        "embed": EMBED,
        "embed_file": embed_file,
        "lm_head": lm_head,
        "strategy": "output" if lm_head else "mean",
        "direction_from": lm_head if lm_head else "mean of healthy rows",
        "pad_id": PAD_ID,
        "kept_ids": [PAD_ID],
        "damaged": [{"id": r, "kind": k, "column": c} for r, k, c in plan],
        "damaged_ids": sorted(r for r, _, _ in plan),
        "weights_files": sorted(files),
        "sha256": {f: sha256(p) for f, p in files.items()},
        "header_length": {f: Header(p).header_length for f, p in files.items()},
        "rtol": {"BF16": 1e-2, "F16": 2e-3}.get(dtype, 1e-5),
    }
    manifest.update(extra or {})
    (out_dir / f"{name}.manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def check_reference_reads(path, expected):
    """The reference reader returns exactly `expected` ({name: raw numpy array}): for the
    copies our own writer, or the reference writer from raw bytes, made."""
    with open(path, "rb") as f:
        loaded = dict(safetensors.deserialize(f.read()))
    if set(loaded) != set(expected):
        raise SystemExit(f"make_damaged: {path}: the reference reader lists other tensors")
    for name, array in expected.items():
        if bytes(loaded[name]["data"]) != np.ascontiguousarray(array).tobytes():
            raise SystemExit(f"make_damaged: {path}: the reference reader reads other bytes "
                             f"for {name}")


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    model_dir, out_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    source = model_dir / SINGLE_NAME
    header = Header(source)
    # Tensors in the file's data order, as our own parser reads them ...
    order = sorted(header.tensors, key=lambda n: header.tensors[n]["begin"])
    with open(source, "rb") as f:
        data = f.read()
    raw = {name: read_tensor(source, header, name, data) for name in order}
    del data
    # ... which must be what the reference reader reads.
    reference = load_file(str(source))
    for name in order:
        if reference[name].tobytes() != raw[name].tobytes():
            raise SystemExit(f"make_damaged: our parser and the reference differ on {name}")
    del reference
    dtypes = {name: header.tensors[name]["dtype"] for name in order}
    embed = raw[EMBED]
    vocab = embed.shape[0]
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("pad_token_id") != PAD_ID:
        raise SystemExit(f"make_damaged: expected pad_token_id {PAD_ID} in config.json")
    out_dir.mkdir(parents=True, exist_ok=True)

    def new_folder(name, config_update=None):
        folder = out_dir / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
        cfg = dict(config)
        cfg.update(config_update or {})
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        return folder

    # (a) F32, the reference writer.
    plan = damage_plan(vocab, seed=1, kind_offset=0)
    folder = new_folder("f32")
    tensors = dict(raw)
    tensors[EMBED] = damage(embed, plan)
    save_file(tensors, str(folder / SINGLE_NAME), metadata={"format": "pt"})
    write_manifest(out_dir, "f32", folder, plan, "F32", None)

    # (b) BF16: every F32 tensor rounded to nearest even; the reference writer (raw specs).
    plan = damage_plan(vocab, seed=2, kind_offset=1)
    folder = new_folder("bf16", {"torch_dtype": "bfloat16"})
    specs, expected = [], {}
    for name in order:
        if dtypes[name] == "F32":
            value = damage(embed, plan) if name == EMBED else raw[name]
            array, spelled = f32_to_bf16(value), "bfloat16"
        else:
            array, spelled = raw[name], {"I64": "int64"}[dtypes[name]]
        specs.append((name, spelled, array))
        expected[name] = array
    reference_serialize_file(specs, folder / SINGLE_NAME, {"format": "pt"})
    bf16_header = Header(folder / SINGLE_NAME)
    if {n: t["dtype"] for n, t in bf16_header.tensors.items()} != {
            n: ("BF16" if d == "F32" else d) for n, d in dtypes.items()}:
        raise SystemExit("make_damaged: the BF16 copy has other dtypes than intended")
    check_reference_reads(folder / SINGLE_NAME, expected)
    write_manifest(out_dir, "bf16", folder, plan, "BF16", None)

    # (c) An untied synthetic LM head: a fixed random orthogonal transform of the pristine
    # embedding, scaled by 0.7 (healthy everywhere, its norms not the input's).
    plan = damage_plan(vocab, seed=3, kind_offset=2)
    folder = new_folder("lmhead", {"tie_word_embeddings": False})
    rng = np.random.default_rng(2024)
    q, _ = np.linalg.qr(rng.standard_normal((embed.shape[1], embed.shape[1])))
    tensors = dict(raw)
    tensors[EMBED] = damage(embed, plan)
    tensors[LM_HEAD] = (embed.astype(np.float64) @ (0.7 * q)).astype(np.float32)
    save_file(tensors, str(folder / SINGLE_NAME), metadata={"format": "pt"})
    write_manifest(out_dir, "lmhead", folder, plan, "F32", LM_HEAD)

    # (d) Unaligned data section: our own writer, an odd-length metadata string and fewer
    # spaces than the 8-byte alignment needs (header length = 5 mod 8).
    plan = damage_plan(vocab, seed=4, kind_offset=3)
    folder = new_folder("unaligned")
    tensors = dict(raw)
    tensors[EMBED] = damage(embed, plan)

    def unaligned(text):
        return text + b" " * ((5 - len(text)) % 8)

    length = write_safetensors(folder / SINGLE_NAME,
                               [(n, dtypes[n], tensors[n]) for n in order],
                               metadata={"format": "pt",
                                         "kshard.test": "unaligned data section (odd)"},
                               header_mod=unaligned)
    if length % 8 == 0 or Header(folder / SINGLE_NAME).data_offset % 8 == 0:
        raise SystemExit("make_damaged: the unaligned copy came out aligned")
    check_reference_reads(folder / SINGLE_NAME, tensors)
    write_manifest(out_dir, "unaligned", folder, plan, "F32", None)

    # (e) Two files with an index; the embedding (with the other embeddings.*) in the second.
    plan = damage_plan(vocab, seed=5, kind_offset=4)
    folder = new_folder("sharded")
    tensors = dict(raw)
    tensors[EMBED] = damage(embed, plan)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    parts = [{n: a for n, a in tensors.items() if not n.startswith("embeddings.")},
             {n: a for n, a in tensors.items() if n.startswith("embeddings.")}]
    weight_map = {}
    for file, part in zip(names, parts):
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(a.nbytes for a in tensors.values())
    (folder / INDEX_NAME).write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
        indent=2) + "\n")
    write_manifest(out_dir, "sharded", folder, plan, "F32", None)

    # (f) F16: every F32 tensor rounded to nearest even by numpy (1e-9-scaled rows become zero);
    # the reference writer.
    plan = damage_plan(vocab, seed=6, kind_offset=5)
    folder = new_folder("f16", {"torch_dtype": "float16"})
    tensors = {n: (damage(embed, plan) if n == EMBED else a).astype(np.float16)
               if dtypes[n] == "F32" else a for n, a in raw.items()}
    save_file(tensors, str(folder / SINGLE_NAME), metadata={"format": "pt"})
    if {n: t["dtype"] for n, t in Header(folder / SINGLE_NAME).tensors.items()} != {
            n: ("F16" if d == "F32" else d) for n, d in dtypes.items()}:
        raise SystemExit("make_damaged: the F16 copy has other dtypes than intended")
    write_manifest(out_dir, "f16", folder, plan, "F16", None)


if __name__ == "__main__":
    main()
