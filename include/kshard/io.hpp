#pragma once

/// \file
/// The whole of kshard::io (CMake target `kshard::io`): `#include <kshard/io.hpp>`.
///
/// Where things are, floor by floor (each includes only the floors below it):
/// - `io/model/`: the vocabulary: element types, stored tensors and their pieces, the options.
/// - `io/engine/`: what moves bytes whatever the format: the conversion plan, the byte mover,
///   tiling, POSIX and MPI-IO files, paths and the write guard, syncing, statistics.
/// - `io/torch/`, `io/safetensors/`: the file encodings formats share (torch.save archives and
///   pickles; safetensors headers, files, reads, writes and undo files).
/// - `io/formats/<name>/`: one folder per checkpoint format (a Hugging Face folder, per-rank
///   shards, PyTorch DCP): how it is read and how its files are laid out when written.
/// - `io/*.hpp`: the faces below, with their internals in `io/checkpoint/` and `io/convert/`.

/// \namespace kshard::io
/// Checkpoints: safetensors files and folders, per-rank shards and PyTorch DCP read into and
/// written from `DistMatrix`es, converted between forms at any rank count, repaired in place.

#include "kshard/io/checkpoint.hpp"
#include "kshard/io/convert.hpp"
#include "kshard/io/engine/io_stats.hpp"
#include "kshard/io/model/durability.hpp"
#include "kshard/io/read_checkpoint.hpp"
#include "kshard/io/rewrite.hpp"
#include "kshard/io/row_patch.hpp"
#include "kshard/io/run_paths.hpp"
#include "kshard/io/safetensors.hpp"
#include "kshard/io/verify.hpp"
