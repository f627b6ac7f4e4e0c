#!/usr/bin/env python3
"""Checks one kshard-repair run on a real checkpoint against the damaged input, the manifest
make_damaged.py wrote for it and the run's --report JSON, with our own safetensors parser
(realdata_common), our own FNV-1a 64 and the reference reader (PyPI safetensors).

    check_repair.py --mode out|in-place|dry-run --damaged PATH [--repaired PATH]
                    --report R.json [--manifest M.json] [--np N] [--kept ID,...]

--damaged is the checkpoint (folder or .safetensors file) as it was before the run: for
--in-place an untouched copy of the folder that was repaired in place (--repaired). Without
--manifest the input is the pristine model: nothing may be found.

Checked, for out and in-place:
  - the damaged input is intact (sha256 of each weights file as the manifest recorded);
  - the report: mode, strategy, direction_from, kept_row_ids (the pad id), mesh size, rows ==
    the damaged ids (found_by absolute), each norm_before as we compute it (null for NaN/Inf),
    target_norm == the RMS norm of the healthy rows, min_norm_before, tensors_touched, and
    files_written;
  - each repaired row finite, of norm target_norm (manifest rtol: 1e-5 F32, 1e-2 BF16,
    2e-3 F16), the report's norm_after, pointing where it should (the LM head row, or the
    mean healthy row);
  - the pad row and every other byte of every file unchanged (header and padding included),
    and per tensor as the reference reader reads them: bit for bit except the repaired rows;
  - interoperability: the reference reader reads the output, with the dtypes and shapes of our
    parser, bytes equal to those at our parser's offsets (and numpy's load_file for F32);
  - tensor_hashes_before/after equal our FNV-1a 64 of every tensor, and differ only for the
    embedding;
  - out: the other files of the folder copied byte for byte, nothing else left in it;
    in-place: nothing but the undo file added, and the undo file (read with the reference
    reader) holds the damaged rows' original bytes.
dry-run: the damaged input intact, the report's rows (none for the pristine model), norms and
hashes, and nothing written.
"""

import argparse
import json
import math
import os
import pathlib
import sys

import numpy as np
import safetensors
from safetensors.numpy import load_file

from realdata_common import (DTYPE_NUMPY, EMBED, Header, as_float64, fnv1a64, sha256,
                             tensor_hashes, weights_files)

MIN_NORM = 1e-6  # kshard-repair's default --min-norm
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
    return condition


def close(a, b, rtol, atol=0.0):
    return a is not None and b is not None and math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def file_bytes(path):
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8)


def reference_tensors(path):
    """{name: (dtype, shape, bytes)} as the reference reader reads the file."""
    with open(path, "rb") as f:
        return {name: (info["dtype"], list(info["shape"]), bytes(info["data"]))
                for name, info in safetensors.deserialize(f.read())}


def embedding(files, name, values=True):
    """(file name, header, raw elements, float64 values or None) of tensor `name`."""
    for file, path in files.items():
        header = Header(path)
        if name in header.tensors:
            t = header.tensors[name]
            begin, end = header.file_range(name)
            with open(path, "rb") as f:
                f.seek(begin)
                raw = f.read(end - begin)
            array = np.frombuffer(raw, dtype=DTYPE_NUMPY[t["dtype"]]).reshape(t["shape"])
            return file, header, array, as_float64(array, t["dtype"]) if values else None
    raise SystemExit(f"check_repair: no tensor {name}")


def row_norms(values):
    with np.errstate(invalid="ignore", over="ignore"):
        return np.sqrt(np.einsum("ij,ij->i", values, values))


def check_hashes(report, key, files, what):
    ours = tensor_hashes(files.values())
    theirs = report.get(key)
    if not check(isinstance(theirs, dict), f"report has no {key}"):
        return ours
    check(set(theirs) == set(ours),
          f"{key} names other tensors than {what} holds: {sorted(set(theirs) ^ set(ours))}")
    for name in sorted(set(theirs) & set(ours)):
        check(theirs[name] == ours[name],
              f"{key}[{name}] is {theirs[name]}, our FNV-1a 64 of {what} is {ours[name]}")
    return ours


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["out", "in-place", "dry-run"], required=True)
    parser.add_argument("--damaged", required=True)
    parser.add_argument("--repaired")
    parser.add_argument("--report", required=True)
    parser.add_argument("--manifest")
    parser.add_argument("--np", type=int)
    parser.add_argument("--kept", help="the kept ids expected, if not the manifest's")
    args = parser.parse_args()

    report = json.loads(pathlib.Path(args.report).read_text())
    manifest = json.loads(pathlib.Path(args.manifest).read_text()) if args.manifest else None
    damaged_path = pathlib.Path(args.damaged)
    damaged_files = weights_files(damaged_path)

    # The damaged input is as make_damaged.py wrote it.
    if manifest:
        for file, path in damaged_files.items():
            check(sha256(path) == manifest["sha256"].get(file),
                  f"the damaged input {path} changed (or is not the manifest's)")

    expected_ids = manifest["damaged_ids"] if manifest else []
    if args.kept is not None:
        kept = sorted(int(k) for k in args.kept.split(",") if k)
    else:
        kept = manifest["kept_ids"] if manifest else [0]
    dtype_expected = manifest["dtype"] if manifest else "F32"
    rtol = manifest["rtol"] if manifest else 1e-5

    # Our own look at the damaged embedding.
    embed_file, embed_header, embed_raw, embed_values = embedding(damaged_files, EMBED)
    dtype = embed_header.tensors[EMBED]["dtype"]
    check(dtype == dtype_expected, f"the embedding is {dtype}, the manifest says {dtype_expected}")
    norms = row_norms(embed_values)
    vocab = embed_values.shape[0]
    is_kept = np.zeros(vocab, bool)
    is_kept[kept] = True
    damaged = ~np.isfinite(norms) | (norms <= MIN_NORM)
    ours_found = np.flatnonzero(damaged & ~is_kept).tolist()
    check(ours_found == expected_ids,
          f"rows damaged in the input (by our norms) {ours_found} != the manifest's {expected_ids}")
    healthy = ~damaged & ~is_kept
    target = math.sqrt(float(np.mean(norms[healthy] ** 2)))
    not_nan = ~np.isnan(norms) & ~is_kept
    min_before = float(norms[not_nan].min())

    # The report.
    mode_text = {"out": "out", "in-place": "in-place", "dry-run": "dry-run"}[args.mode]
    check(report.get("mode") == mode_text, f"report mode {report.get('mode')} != {mode_text}")
    check(report.get("embed") == EMBED, f"report embed {report.get('embed')}")
    if manifest:
        check(report.get("strategy") == manifest["strategy"],
              f"report strategy {report.get('strategy')} != {manifest['strategy']}")
        check(report.get("lm_head") == manifest["lm_head"],
              f"report lm_head {report.get('lm_head')} != {manifest['lm_head']}")
        check(report.get("direction_from") == manifest["direction_from"],
              f"report direction_from {report.get('direction_from')} != "
              f"{manifest['direction_from']}")
    if args.np:
        check(int(np.prod(report.get("mesh", [0]))) == args.np,
              f"report mesh {report.get('mesh')} is not {args.np} ranks")
    check(report.get("kept_row_ids") == kept,
          f"report kept_row_ids {report.get('kept_row_ids')} != {kept}")
    rows = report.get("rows", [])
    ids = [r["id"] for r in rows]
    check(ids == expected_ids, f"report rows {ids} != the damaged ids {expected_ids}")
    for r in rows:
        check(r.get("found_by") == "absolute", f"row {r['id']}: found_by {r.get('found_by')}")
        if 0 <= r["id"] < vocab:
            mine = float(norms[r["id"]])
            if math.isfinite(mine):
                check(close(r.get("norm_before"), mine, 1e-6, 1e-30),
                      f"row {r['id']}: norm_before {r.get('norm_before')}, ours {mine}")
            else:
                check(r.get("norm_before") is None,
                      f"row {r['id']}: norm_before {r.get('norm_before')} for a {mine} norm")
    check(close(report.get("min_norm_before"), min_before, 1e-9, 1e-30),
          f"report min_norm_before {report.get('min_norm_before')}, ours {min_before}")
    if expected_ids:
        check(close(report.get("target_norm"), target, 1e-9),
              f"report target_norm {report.get('target_norm')}, our RMS of the healthy rows "
              f"{target}")
    else:
        check(report.get("target_norm") is None, "a target_norm without damaged rows")

    if args.mode == "dry-run":
        check(report.get("files_written") == [], f"dry run wrote {report.get('files_written')}")
        check(report.get("tensors_touched") == [], "dry run touched tensors")
        check("tensor_hashes_after" not in report, "dry run has tensor_hashes_after")
        for r in rows:
            check(r.get("norm_after") is None, f"dry run row {r['id']} has a norm_after")
        check_hashes(report, "tensor_hashes_before", damaged_files, "the input")
        return

    # The output, byte for byte.
    repaired_path = pathlib.Path(args.repaired)
    repaired_files = weights_files(repaired_path)
    if damaged_path.is_file():  # a file repaired into a file of another name
        repaired_files = {damaged_path.name: repaired_path}
    check(sorted(repaired_files) == sorted(damaged_files),
          f"output weights files {sorted(repaired_files)} != input's {sorted(damaged_files)}")
    check(report.get("tensors_touched") == [EMBED],
          f"tensors_touched {report.get('tensors_touched')}")
    written = sorted(os.path.realpath(p) for p in report.get("files_written", []))
    if args.mode == "out":
        expected_written = sorted(os.path.realpath(p) for p in repaired_files.values())
    else:
        expected_written = [os.path.realpath(repaired_files[embed_file])]
    check(written == expected_written, f"files_written {written} != {expected_written}")

    row_bytes = embed_header.row_bytes(EMBED)
    embed_begin, _ = embed_header.file_range(EMBED)
    for file in sorted(set(repaired_files) & set(damaged_files)):
        before = file_bytes(damaged_files[file])
        after = file_bytes(repaired_files[file])
        if not check(before.size == after.size,
                     f"{file}: {after.size} bytes written, the input has {before.size}"):
            continue
        differ = np.flatnonzero(before != after)
        if file == embed_file:
            row = (differ.astype(np.int64) - embed_begin) // row_bytes
            allowed = (differ >= embed_begin) & np.isin(row, expected_ids)
            bad = differ[~allowed]
        else:
            bad = differ
        check(bad.size == 0, f"{file}: {bad.size} bytes outside the repaired rows differ, the "
                             f"first at offset {bad[:1].tolist()}")

    # Per tensor, as the reference reader reads input and output; and the output as our own
    # parser finds it (interoperability).
    for file in sorted(set(repaired_files) & set(damaged_files)):
        ref_before = reference_tensors(damaged_files[file])
        ref_after = reference_tensors(repaired_files[file])
        header = Header(repaired_files[file])
        data = file_bytes(repaired_files[file])
        check(set(ref_after) == set(header.tensors) == set(ref_before),
              f"{file}: the reference reader and our parser list other tensors")
        for name, (dt, shape, raw) in ref_after.items():
            t = header.tensors.get(name)
            if t is None:
                continue
            begin, end = header.file_range(name)
            check(dt == t["dtype"] and shape == t["shape"],
                  f"{file}: {name}: reference {dt} {shape}, ours {t['dtype']} {t['shape']}")
            check(raw == data[begin:end].tobytes(),
                  f"{file}: {name}: the reference reader reads other bytes than kshard wrote")
            old = ref_before.get(name)
            if old is None:
                continue
            if name != EMBED:
                check(raw == old[2], f"{file}: tensor {name} changed")
            else:
                a = np.frombuffer(old[2], np.uint8).reshape(vocab, row_bytes)
                b = np.frombuffer(raw, np.uint8).reshape(vocab, row_bytes)
                changed = np.flatnonzero((a != b).any(axis=1)).tolist()
                check(changed == expected_ids,
                      f"{file}: embedding rows {changed} changed, not the damaged "
                      f"{expected_ids}")
        if "BF16" not in {t["dtype"] for t in header.tensors.values()}:  # numpy has no BF16
            numpy_view = load_file(str(repaired_files[file]))
            for name, array in numpy_view.items():
                begin, end = header.file_range(name)
                check(array.tobytes() == data[begin:end].tobytes(),
                      f"{file}: numpy load_file reads {name} otherwise")

    # The repaired rows.
    _, out_header, out_raw, _ = embedding(repaired_files, EMBED, values=False)
    out_values = {i: as_float64(out_raw[i], dtype) for i in expected_ids}
    if manifest and manifest["lm_head"]:
        _, head_header, head, _ = embedding(damaged_files, manifest["lm_head"], values=False)
        head_dtype = head_header.tensors[manifest["lm_head"]]["dtype"]
        direction = lambda i: as_float64(head[i], head_dtype)  # noqa: E731
    else:
        mean = embed_values[healthy].mean(axis=0)
        direction = lambda i: mean  # noqa: E731
    cos_tol = 1e-6 if dtype == "F32" else 1e-4
    by_id = {r["id"]: r for r in rows}
    for i in expected_ids:
        row = out_values[i]
        norm = float(np.sqrt(row @ row))
        check(np.isfinite(row).all(), f"repaired row {i} is not finite")
        check(close(norm, report.get("target_norm"), rtol),
              f"repaired row {i} has norm {norm}, target_norm {report.get('target_norm')}")
        check(close(norm, target, rtol), f"repaired row {i} has norm {norm}, our target {target}")
        check(close(by_id.get(i, {}).get("norm_after"), norm, 1e-6),
              f"row {i}: report norm_after {by_id.get(i, {}).get('norm_after')}, ours {norm}")
        d = direction(i)
        cos = float(row @ d / (np.linalg.norm(row) * np.linalg.norm(d)))
        check(cos > 1 - cos_tol, f"repaired row {i} points elsewhere than "
                                 f"{manifest['direction_from'] if manifest else 'expected'} "
                                 f"(cos {cos})")
    for p in kept:
        check(out_raw[p].tobytes() == embed_raw[p].tobytes(), f"kept row {p} changed")

    # The report's hashes.
    before = check_hashes(report, "tensor_hashes_before", damaged_files, "the input")
    after = check_hashes(report, "tensor_hashes_after", repaired_files, "the output")
    changed = sorted(n for n in before if after.get(n) != before[n])
    check(changed == [EMBED], f"tensors whose hash changed: {changed}, expected only {EMBED}")
    reported = report.get("tensor_hashes_before", {})
    reported_after = report.get("tensor_hashes_after", {})
    check(sorted(n for n in reported if reported_after.get(n) != reported[n]) == [EMBED],
          "the report's hashes differ for other tensors than the embedding")

    # The rest of the folder.
    if damaged_path.is_dir():
        names_before = sorted(p.name for p in damaged_path.iterdir())
        names_after = sorted(p.name for p in repaired_path.iterdir())
        undo = f"{embed_file}.kshard-undo"
        expected_names = sorted(names_before + ([undo] if args.mode == "in-place" else []))
        check(names_after == expected_names, f"the output folder holds {names_after}, "
                                             f"expected {expected_names}")
        for p in damaged_path.iterdir():
            if p.name not in damaged_files and (repaired_path / p.name).is_file():
                check((repaired_path / p.name).read_bytes() == p.read_bytes(),
                      f"{p.name} was not copied byte for byte")
    if args.mode == "in-place":
        undo_path = repaired_files[embed_file].parent / f"{embed_file}.kshard-undo"
        if check(undo_path.is_file(), f"no undo file {undo_path}"):
            with open(undo_path, "rb") as f:
                undo_bytes = f.read()
            loaded = dict(safetensors.deserialize(undo_bytes))
            meta = Header(undo_path).metadata or {}
            check(meta.get("kshard.undo") == "2" and meta.get("0.name") == EMBED and
                  meta.get("kshard.state") == "written", f"undo file metadata {meta}")
            check(os.path.realpath(meta.get("kshard.target", "")) ==
                  os.path.realpath(repaired_files[embed_file]),
                  f"undo file names target {meta.get('kshard.target')}")
            # What the write left: the file's identity and size, and the FNV-1a 64 of the rows
            # it wrote (kshard's Digest ends each piece with a 0xff byte).
            info = os.stat(repaired_files[embed_file])
            check([meta.get("kshard.target_device"), meta.get("kshard.target_inode"),
                   meta.get("kshard.target_size")] ==
                  [str(info.st_dev), str(info.st_ino), str(info.st_size)],
                  f"undo file identity {meta}, the file's {info}")
            written = b"".join(out_raw[i].tobytes() for i in expected_ids) + b"\xff"
            check(meta.get("0.written_hash") == "%016x" % fnv1a64(written),
                  f"undo file written_hash {meta.get('0.written_hash')}")
            if "0.rows" in loaded and "0.bytes" in loaded:
                saved_ids = np.frombuffer(bytes(loaded["0.rows"]["data"]), np.int64).tolist()
                check(saved_ids == expected_ids, f"undo file rows {saved_ids}")
                original = b"".join(embed_raw[i].tobytes() for i in expected_ids)
                check(bytes(loaded["0.bytes"]["data"]) == original,
                      "the undo file does not hold the damaged rows' original bytes")
            else:
                check(False, f"undo file tensors {sorted(loaded)}")


if __name__ == "__main__":
    main()
    if failures:
        shown = int(os.environ.get("KSHARD_REALDATA_SHOW", "20"))
        for f in failures[:shown]:
            print(f"check_repair: FAIL: {f}", file=sys.stderr)
        if len(failures) > shown:
            print(f"check_repair: ... and {len(failures) - shown} more", file=sys.stderr)
        sys.exit(1)
    print("check_repair: ok")
