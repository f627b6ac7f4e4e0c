#!/usr/bin/env python3
"""Checks what kshard-convert wrote against the reference safetensors package, for
tests/tool/convert.sh. Exit 0 with "ok ..." when it holds, 1 with the differences on stderr.

    check_convert.py hf OUT CASE SOURCE [--max-shard-size BYTES]
    check_convert.py sharded OUT CASE SOURCE --mesh 3 [--layout L] [--layout-for PATTERN=L ...]
    check_convert.py progress LOG CASE
    check_convert.py same OUT_FILE EXPECTED_FILE

CASE names the expected global tensors (make_convert_cases.CASES: model, shards, big); SOURCE is
the folder converted (its config.json and tokenizer.json, or those of its .hf_metadata/, must
have been copied).
  hf:       every tensor equal (dtype, shape, bytes), read with safetensors.deserialize; each
            file's header padded to 8 bytes with {"format": "pt"} metadata; model.safetensors
            alone, or the files a greedy split at BYTES makes (tensors in name order, a new file
            where the next would pass BYTES) with a model.safetensors.index.json whose
            weight_map and metadata.total_size are right;
            the side files copied (not the job's fqn_to_*.json maps).
  sharded:  one shard-0000{r+1}-model-00001-of-00001.safetensors per rank of the mesh holding a
            box, each tensor's box the torch.chunk arithmetic of its layout (the first
            --layout-for pattern it matches, fnmatch, else --layout, default Shard(0) on every
            mesh dimension), its DCP_SHARDING_INFO offsets and its bytes that box of the tensor;
            .hf_metadata/ holding the side files.
  progress: the last progress line of LOG ("X of Y GB, ...") has X == Y == the case's bytes.
  same:     OUT_FILE holds exactly EXPECTED_FILE's tensors (names, dtypes, shapes, bytes)."""
import argparse
import fnmatch
import json
import os
import re
import struct
import sys

import numpy as np
from safetensors import deserialize, safe_open

from make_convert_cases import CASES, chunk

SIDE_FILES = ['config.json', 'tokenizer.json']
JOB_MAPS = ['fqn_to_file_index_mapping.json', 'fqn_to_dtype_mapping.json']
problems = []


def expect(condition, message):
    if not condition:
        problems.append(message)
    return condition


def read_file(path):
    """name -> (dtype, shape, bytes) by the reference reader, and the file's metadata."""
    with open(path, 'rb') as f:
        data = f.read()
    header_bytes = struct.unpack('<Q', data[:8])[0]
    expect(header_bytes % 8 == 0, f'{path}: header of {header_bytes} bytes, not padded to 8')
    tensors = {name: (t['dtype'], list(t['shape']), bytes(t['data']))
               for name, t in deserialize(data)}
    with safe_open(path, framework='numpy') as f:
        return tensors, f.metadata() or {}


def same_tensor(where, name, got, dtype, array):
    want = (dtype, list(array.shape), np.ascontiguousarray(array).tobytes())
    if got is None:
        return expect(False, f'{where}: no tensor {name}')
    for what, g, w in zip(('dtype', 'shape', 'bytes'), got, want):
        if not expect(g == w, f'{where}: {name}: {what} differs' +
                      (f' ({g} != {w})' if what != 'bytes' else '')):
            return False
    return True


def side_files_copied(out, source, into):
    """The source's side files (from .hf_metadata/ where it has one) are in out/into, equal."""
    origin = f'{source}/.hf_metadata' if os.path.isdir(f'{source}/.hf_metadata') else source
    for name in SIDE_FILES:
        with open(f'{origin}/{name}', 'rb') as a:
            copied = f'{out}/{into}{name}'
            expect(os.path.isfile(copied) and open(copied, 'rb').read() == a.read(),
                   f'{copied}: not a copy of {origin}/{name}')
    if not into:
        for name in JOB_MAPS:
            expect(not os.path.exists(f'{out}/{name}'), f'{out}/{name}: the job map was copied')


def hf_split(tensors, max_bytes):
    """The files a greedy split at `max_bytes` makes of `tensors` in name order: [[names]]."""
    groups, size = [[]], 0
    for name in sorted(tensors):
        nbytes = tensors[name][1].nbytes
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def check_index(out, files, tensors):
    with open(f'{out}/model.safetensors.index.json') as f:
        index = json.load(f)
    weight_map = {name: file for file, names in files.items() for name in names}
    expect(index.get('weight_map') == weight_map, f'{out}: weight_map {index.get("weight_map")}')
    total = sum(array.nbytes for _, array in tensors.values())
    expect(index.get('metadata', {}).get('total_size') == total,
           f'{out}: metadata.total_size {index.get("metadata")} != {total}')


def check_hf(out, case, source, max_bytes):
    tensors = CASES[case]()
    groups = hf_split(tensors, max_bytes)
    names = (['model.safetensors'] if len(groups) == 1 else
             [f'model-{i + 1:05}-of-{len(groups):05}.safetensors' for i in range(len(groups))])
    files = dict(zip(names, groups))
    weights = sorted(n for n in os.listdir(out) if n.endswith('.safetensors'))
    expect(weights == names, f'{out}: weights files {weights}, expected {names}')
    expect(os.path.exists(f'{out}/model.safetensors.index.json') == (len(groups) > 1),
           f'{out}: an index where none belongs, or none where one does')
    if len(groups) > 1:
        check_index(out, files, tensors)
    for file, group in files.items():
        if not os.path.isfile(f'{out}/{file}'):
            continue
        got, metadata = read_file(f'{out}/{file}')
        expect(metadata == {'format': 'pt'}, f'{file}: metadata {metadata}')
        expect(sorted(got) == group, f'{file}: holds {sorted(got)}, expected {group}')
        for name in group:
            same_tensor(file, name, got.get(name), *tensors[name])
    if case != 'big':
        side_files_copied(out, source, '')


def parse_layout(text, mesh_dims):
    """'Shard(0), Replicate()' -> [0, None] (the tensor dimension each mesh dimension splits)."""
    if not text:
        return [0] * mesh_dims
    layout = []
    for part in re.findall(r'(Shard\(\s*\d+\s*\)|Replicate\(\s*\))', text):
        layout.append(int(re.search(r'\d+', part).group()) if part.startswith('Shard') else None)
    return layout


def rank_box(shape, layout, mesh, coords):
    """The box (offsets, shape) a rank at `coords` holds under `layout`, or None where it
    holds no first copy: torch.chunk on each split, nested in mesh order."""
    offsets, extents = [0] * len(shape), list(shape)
    for m, dim in enumerate(layout):
        if dim is None or dim >= len(shape):
            if coords[m] != 0:
                return None
            continue
        begin, end = chunk(extents[dim], mesh[m], int(coords[m]))
        offsets[dim] += int(begin)
        extents[dim] = int(end - begin)
    return offsets, extents


def expected_shards(tensors, mesh, layout, rules):
    """file name -> {tensor: (offsets, shape)} for every rank of `mesh` holding a box."""
    files = {}
    for rank in range(int(np.prod(mesh))):
        coords = list(np.unravel_index(rank, mesh))
        boxes = {}
        for name, (_, array) in tensors.items():
            chosen = next((lay for pattern, lay in rules if fnmatch.fnmatchcase(name, pattern)),
                          layout)
            box = rank_box(array.shape, chosen, mesh, coords)
            if box is not None:
                boxes[name] = box
        if boxes:
            files[f'shard-{rank + 1:05}-model-00001-of-00001.safetensors'] = boxes
    return files


def check_shard_file(path, boxes, tensors):
    got, metadata = read_file(path)
    expect(sorted(got) == sorted(boxes), f'{path}: holds {sorted(got)}, expected {sorted(boxes)}')
    info = json.loads(metadata.get('DCP_SHARDING_INFO', '{}'))
    expect(metadata.get('DCP_VERSION') == '1.0' and metadata.get('format') == 'pt',
           f'{path}: metadata {metadata}')
    for name, (offsets, shape) in boxes.items():
        saved = info.get(name, {}).get('saved_offsets')
        expect(saved == offsets, f'{path}: {name}: saved_offsets {saved}, expected {offsets}')
        dtype, array = tensors[name]
        piece = array[tuple(slice(o, o + s) for o, s in zip(offsets, shape))]
        same_tensor(path, name, got.get(name), dtype, piece)


def check_sharded(out, case, source, mesh_text, layout_text, rules_text):
    tensors = CASES[case]()
    mesh = [int(x) for x in mesh_text.split('x')]
    rules = [(rule.split('=', 1)[0], parse_layout(rule.split('=', 1)[1], len(mesh)))
             for rule in rules_text]
    files = expected_shards(tensors, mesh, parse_layout(layout_text, len(mesh)), rules)
    weights = sorted(n for n in os.listdir(out) if n.endswith('.safetensors'))
    expect(weights == sorted(files), f'{out}: files {weights}, expected {sorted(files)}')
    for name, boxes in files.items():
        if os.path.isfile(f'{out}/{name}'):
            check_shard_file(f'{out}/{name}', boxes, tensors)
    side_files_copied(out, source, '.hf_metadata/')


def check_progress(log, case):
    total = sum(array.nbytes for _, array in CASES[case]().values())
    with open(log, errors='replace') as f:
        lines = re.findall(r'([\d.]+) of ([\d.]+) GB, ', f.read())
    if expect(lines, f'{log}: no progress line'):
        done, of = lines[-1]
        want = f'{total / 1e9:.2f}'
        expect(done == of == want, f'{log}: the last progress line says {done} of {of} GB; '
               f'the conversion wrote {want} GB ({total} bytes)')


def check_same(out, expected):
    got, _ = read_file(out)
    want, _ = read_file(expected)
    expect(sorted(got) == sorted(want), f'{out} holds {sorted(got)}, {expected} {sorted(want)}')
    for name, tensor in want.items():
        expect(got.get(name) == tensor, f'{out}: tensor {name} differs from {expected}\'s')


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('what', choices=['hf', 'sharded', 'progress', 'same'])
    parser.add_argument('out')
    parser.add_argument('case', help=f'one of {sorted(CASES)}; for same, the expected file')
    parser.add_argument('source', nargs='?')
    parser.add_argument('--max-shard-size', type=int, default=5_000_000_000)
    parser.add_argument('--mesh', default='1')
    parser.add_argument('--layout', default='')
    parser.add_argument('--layout-for', action='append', default=[])
    a = parser.parse_args()
    if a.what != 'same' and a.case not in CASES:
        parser.error(f'CASE must be one of {sorted(CASES)}')
    if a.what == 'same':
        check_same(a.out, a.case)
    elif a.what == 'hf':
        check_hf(a.out, a.case, a.source, a.max_shard_size)
    elif a.what == 'sharded':
        check_sharded(a.out, a.case, a.source, a.mesh, a.layout, a.layout_for)
    else:
        check_progress(a.out, a.case)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f'ok {a.what} {a.out}')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
