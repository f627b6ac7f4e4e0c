#!/usr/bin/env python3
"""Small checkpoints for tests/tool/convert.sh (kshard-convert), with numpy and safetensors.

    make_convert_cases.py DIR

Writes under DIR:
  model/        a consolidated Hugging Face model, written by the reference safetensors package
                (F32, F16, I64, BOOL, a 0-d tensor), with config.json, tokenizer.json and a
                subfolder (1_Pooling/config.json);
  shards/       the per-rank shards a 4-rank job writes (as torch's HuggingFaceStorageWriter and
                NeMo AutoModel do: shard-0000{r+1}-model-00001-of-00001.safetensors, each piece
                placed by DCP_SHARDING_INFO), Shard(0) on every tensor but o_proj (Shard(1)) and
                the norm (Replicate(), kept once, in rank 1's file): a 3-D BF16 tensor, an I64
                1-D, a BOOL, empty pieces (offset = the extent, as torch writes them); with
                .hf_metadata/ (config.json, tokenizer.json and the job's fqn_to_*.json maps);
  lying/        two shards whose pieces of one tensor overlap (rows 3-4 in both);
  big.safetensors  one 24 MB F32 tensor (6,000,001 elements: not a multiple of 3 ranks' shares).

The expected global tensors are `CASES[name]()` (import this module): name -> (dtype, array),
BF16 as its uint16 bit patterns. Values are distinct per element (BOOL excepted) and exact."""
import json
import os
import struct
import sys

import numpy as np
from safetensors.numpy import save_file

NUMPY = {'F32': np.float32, 'F16': np.float16, 'I64': np.int64, 'BOOL': np.bool_,
         'BF16': np.uint16}
WRITER_RANKS = 4  # the job that wrote shards/
CONFIG = {'architectures': ['LlamaForCausalLM'], 'vocab_size': 37, 'hidden_size': 8,
          'pad_token_id': 0, 'tie_word_embeddings': False}
TOKENIZER = {'version': '1.0', 'model': {'type': 'BPE', 'vocab': {'<pad>': 0, 'a': 1}}}


def values(dtype, shape, seed):
    """Distinct exact values of `shape` (BF16: the bits of small multiples of 1/4)."""
    count = int(np.prod(shape, dtype=np.int64))
    ramp = np.arange(count, dtype=np.int64) + 7 * seed
    if dtype == 'BOOL':
        return ((ramp * 7 + seed) % 3 == 0).reshape(shape)
    if dtype == 'I64':
        return (ramp * 1_000_003 - 40).reshape(shape)
    if dtype == 'BF16':
        floats = ((ramp % 512) * 0.25 - 64).astype(np.float32)
        return (floats.view(np.uint32) >> 16).astype(np.uint16).reshape(shape)
    return ((ramp % 2048) * 0.25 - 100).astype(NUMPY[dtype]).reshape(shape)


def tensors(specs):
    return {name: (dtype, values(dtype, shape, seed))
            for seed, (name, dtype, shape) in enumerate(specs)}


def model_tensors():
    return tensors([
        ('model.embed_tokens.weight', 'F32', (37, 8)),
        ('model.layers.0.self_attn.q_proj.weight', 'F16', (12, 8)),
        ('model.layers.0.self_attn.o_proj.weight', 'F32', (8, 12)),
        ('model.layers.0.mlp.router.tokens', 'I64', (10,)),
        ('model.layers.0.mlp.router.mask', 'BOOL', (6, 2)),
        ('model.norm.weight', 'F32', (8,)),
        ('model.logit_scale', 'F32', ()),
        ('lm_head.weight', 'F32', (37, 8)),
    ])


# name -> (dtype, global shape, how the 4-rank writer placed it: ('S', d) or ('R',)).
SHARD_SPECS = [
    ('model.embed_tokens.weight', 'BF16', (37, 8), ('S', 0)),
    ('model.layers.0.mlp.experts.gate_up_proj', 'BF16', (3, 5, 4), ('S', 0)),
    ('model.layers.0.mlp.tokens_per_expert', 'I64', (10,), ('S', 0)),
    ('model.layers.0.mlp.expert_mask', 'BOOL', (6, 2), ('S', 0)),
    ('model.layers.0.mlp.router.weight', 'F32', (2, 8), ('S', 0)),
    ('model.layers.0.self_attn.o_proj.weight', 'F32', (8, 12), ('S', 1)),
    ('model.norm.weight', 'F32', (8,), ('R',)),
    ('lm_head.weight', 'F32', (37, 8), ('S', 0)),
]


def shard_tensors():
    return tensors([(name, dtype, shape) for name, dtype, shape, _ in SHARD_SPECS])


def big_tensors():
    return {'w': ('F32', (np.arange(6_000_001, dtype=np.int64) % 4096 * 0.5).astype(np.float32))}


CASES = {'model': model_tensors, 'shards': shard_tensors, 'big': big_tensors}


def chunk(extent, parts, index):
    """torch.chunk's piece `index` of `parts` of [0, extent): (begin, end), empty past the end."""
    size = -(-extent // parts)
    begin = min(index * size, extent)
    return begin, min(begin + size, extent)


def write_shard(path, pieces, metadata):
    """A safetensors file as torch writes a shard: pieces [(name, dtype, array, offsets)], their
    offsets in __metadata__['DCP_SHARDING_INFO'], the header padded with spaces to 8 bytes."""
    info = {name: {'saved_offsets': list(offsets)} for name, _, _, offsets in pieces}
    header = {'__metadata__': {**metadata, 'DCP_SHARDING_INFO': json.dumps(info),
                               'DCP_VERSION': '1.0', 'format': 'pt'}}
    body = b''
    for name, dtype, array, _ in pieces:
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {'dtype': dtype, 'shape': list(array.shape),
                        'data_offsets': [len(body), len(body) + len(data)]}
        body += data
    text = json.dumps(header).encode()
    text += b' ' * (-len(text) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)) + text + body)


def shard_name(rank):
    return f'shard-{rank + 1:05}-model-00001-of-00001.safetensors'


def write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(value, f, indent=2)


def write_shards(folder):
    """shards/: what each rank of the 4-rank job holds, as it writes it."""
    os.makedirs(folder, exist_ok=True)
    expected = shard_tensors()
    for rank in range(WRITER_RANKS):
        pieces = []
        for name, dtype, shape, placement in SHARD_SPECS:
            array = expected[name][1]
            if placement[0] == 'R':
                if rank == 1:  # a replicated tensor is kept once, not necessarily by rank 0
                    pieces.append((name, dtype, array, [0] * len(shape)))
                continue
            d = placement[1]
            begin, end = chunk(shape[d], WRITER_RANKS, rank)
            offsets = [0] * len(shape)
            offsets[d] = begin
            pieces.append((name, dtype, np.take(array, range(begin, end), axis=d), offsets))
        write_shard(f'{folder}/{shard_name(rank)}', pieces, {})
    meta = f'{folder}/.hf_metadata'
    write_json(f'{meta}/config.json', CONFIG)
    write_json(f'{meta}/tokenizer.json', TOKENIZER)
    write_json(f'{meta}/fqn_to_file_index_mapping.json', {n: 1 for n, *_ in SHARD_SPECS})


def write_model(folder):
    """model/: a consolidated model written by the reference package."""
    os.makedirs(folder, exist_ok=True)
    save_file({name: array for name, (_, array) in model_tensors().items()},
              f'{folder}/model.safetensors', metadata={'format': 'pt'})
    write_json(f'{folder}/config.json', CONFIG)
    write_json(f'{folder}/tokenizer.json', TOKENIZER)
    write_json(f'{folder}/1_Pooling/config.json', {'word_embedding_dimension': 8})


def write_lying(folder):
    """lying/: two shards whose pieces of `w` overlap (rows 3-4 are in both)."""
    os.makedirs(folder, exist_ok=True)
    w = values('F32', (8, 4), 1)
    write_shard(f'{folder}/{shard_name(0)}', [('w', 'F32', w[0:5], [0, 0])], {})
    write_shard(f'{folder}/{shard_name(1)}', [('w', 'F32', w[3:8], [3, 0])], {})


def main(out):
    write_model(f'{out}/model')
    write_shards(f'{out}/shards')
    write_lying(f'{out}/lying')
    save_file({'w': big_tensors()['w'][1]}, f'{out}/big.safetensors', metadata={'format': 'pt'})


if __name__ == '__main__':
    main(sys.argv[1])
