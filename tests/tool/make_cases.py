#!/usr/bin/env python3
"""Small safetensors checkpoints for tests/tool/run.sh, with Python's standard library only.

    make_cases.py DIR

A 12 x 8 F32 embedding with row 3 zero and row 7 NaN, next to an F32 LM head, and variants
the tool must refuse (wrong rank, dtypes, shapes, damage it cannot repair)."""
import json
import math
import os
import struct
import sys

V, H = 12, 8
EMBED, LM_HEAD = 'model.embed_tokens.weight', 'lm_head.weight'
CODES = {'F32': 'f', 'F64': 'd', 'F16': 'e'}


def matrix(seed, rows=V, cols=H):
    return [[math.sin(seed + 0.37 * r + 1.13 * c) + 0.1 for c in range(cols)] for r in range(rows)]


def flat(value):
    return [x for row in value for x in flat(row)] if isinstance(value, list) else [value]


def shape_of(value):
    return [len(value)] + shape_of(value[0]) if isinstance(value, list) and value else (
        [0] if isinstance(value, list) else [])


def write(path, tensors):
    """tensors: [(name, dtype, nested list)]"""
    header, body = {'__metadata__': {'format': 'pt'}}, b''
    for name, dtype, value in tensors:
        data = struct.pack('<%d%s' % (len(flat(value)), CODES[dtype]), *flat(value))
        header[name] = {'dtype': dtype, 'shape': shape_of(value),
                        'data_offsets': [len(body), len(body) + len(data)]}
        body += data
    text = json.dumps(header).encode()
    text += b' ' * (-len(text) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)) + text + body)


def main(out):
    os.makedirs(out, exist_ok=True)
    embed, head = matrix(1), matrix(2)
    embed[3] = [0.0] * H
    embed[7] = [float('nan')] * H
    good = [(EMBED, 'F32', embed), (LM_HEAD, 'F32', head), ('model.norm.weight', 'F32', [1.0] * H)]
    write(f'{out}/good.safetensors', good)
    write(f'{out}/embed_1d.safetensors', [(EMBED, 'F32', flat(embed)), (LM_HEAD, 'F32', head)])
    write(f'{out}/embed_3d.safetensors', [(EMBED, 'F32', [embed]), (LM_HEAD, 'F32', head)])
    write(f'{out}/lm_f16.safetensors', [(EMBED, 'F32', embed), (LM_HEAD, 'F16', head)])
    write(f'{out}/lm_f64.safetensors', [(EMBED, 'F32', embed), (LM_HEAD, 'F64', head)])
    write(f'{out}/lm_shape.safetensors',
          [(EMBED, 'F32', embed), (LM_HEAD, 'F32', [row[:H - 1] for row in head])])
    damaged_head = [list(row) for row in head]
    damaged_head[3] = [0.0] * H
    write(f'{out}/lm_damaged.safetensors', [(EMBED, 'F32', embed), (LM_HEAD, 'F32', damaged_head)])
    write(f'{out}/all_damaged.safetensors',
          [(EMBED, 'F32', [[float('nan')] * H for _ in range(V)]), (LM_HEAD, 'F32', head)])
    # A folder the way sentence-transformers keep one: a subfolder next to the weights.
    folder = f'{out}/folder'
    os.makedirs(f'{folder}/1_Pooling', exist_ok=True)
    write(f'{folder}/model.safetensors', good)
    with open(f'{folder}/config.json', 'w') as f:
        json.dump({'pad_token_id': 0, 'tie_word_embeddings': False}, f)
    with open(f'{folder}/1_Pooling/config.json', 'w') as f:
        json.dump({'word_embedding_dimension': H}, f)
    with open(f'{folder}/tokenizer.json', 'w') as f:
        f.write('{}\n')
    # A sharded folder: the embedding in the first shard, the LM head in the second.
    sharded = f'{out}/sharded'
    os.makedirs(sharded, exist_ok=True)
    shards = {'model-00001-of-00002.safetensors': good[:1],
              'model-00002-of-00002.safetensors': good[1:]}
    for name, tensors in shards.items():
        write(f'{sharded}/{name}', tensors)
    with open(f'{sharded}/model.safetensors.index.json', 'w') as f:
        json.dump({'metadata': {}, 'weight_map': {t[0]: name for name, tensors in shards.items()
                                                  for t in tensors}}, f)


if __name__ == '__main__':
    main(sys.argv[1])
