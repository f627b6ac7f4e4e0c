#pragma once

/// \file
/// Tensor-parallel building blocks (Megatron style) over one mesh dimension, the "tp" dimension:
/// the vocabulary-parallel embedding lookup and its backward
/// (kshard/tensor_parallel/embedding.hpp), reduce-from / copy-to the tensor-parallel region
/// (kshard/tensor_parallel/region.hpp), and row- and column-parallel linear layers, forward and
/// backward (kshard/tensor_parallel/linear.hpp). This header includes all three, and
/// `kshard::TpDim` (kshard/tensor_parallel/tp_dim.hpp).
///
/// Conventions shared by every function there:
/// - `tp_dim` is the tensor-parallel mesh dimension, given as a `kshard::TpDim`
///   (`kshard::TpDim{mesh.dim("tp")}`), so that it cannot be taken for the lookup's scale (a
///   floating-point number) nor a scale for it. Matrices must be split over exactly that mesh
///   dimension and replicated over every other one; what the layout type decides is checked at
///   compile time, the rest (which dimension, shapes, meshes) throws `kshard::error` naming the
///   values. Every function that takes a matrix defaults `tp_dim` to the one mesh dimension that
///   splits the table's rows or the weight's features, read from the layout type; a `tp_dim` given
///   that is not that dimension is an error naming both. A bare integer in its place does not
///   compile.
/// - A linear layer's bias (and bias gradient) is a rank-1 view of this rank's part, or the
///   `out x 1` `DistMatrix` of `kshard::distribute_bias` (kshard/tensor_parallel/bias.hpp), split
///   like the weight's rows: sharded for a column-parallel layer, replicated for a row-parallel
///   one.
/// - Replicated inputs (token ids, `x` of a column-parallel layer, output gradients of a
///   row-parallel layer or of a lookup) must hold the same values on every rank of the tp group.
/// - Functions that communicate agree on their argument checks over the whole mesh first, so a
///   problem found on any rank is the same `kshard::error` on every rank, before anything is
///   written. Functions that do not communicate check without communicating: they throw on the
///   ranks whose arguments are wrong (every rank, for wrong replicated arguments).
/// - Forward functions return new views; backward functions return the input gradient as a new
///   view and *add* the parameter gradients into the gradient matrices and views given (as
///   PyTorch accumulates `.grad`). A layer without a bias takes `kshard::no_bias`, the
///   default, which also stands before a `tp_dim` given without a bias.
/// - Every function has a form whose first argument is an execution-space instance (the
///   kokkos-kernels `gemm(space, ...)` convention): its kernels, copies and fences run on that
///   instance, and MPI reads a buffer only after that instance is fenced. The instance must be
///   able to access the matrix's memory, and views passed in must be readable from it. The
///   forms without one use a default instance of the matrix's (or view's) execution space.
/// - Sums are deterministic: every output element is summed in a fixed order (over k for the
///   products, over token positions for the lookup backward), the same on every backend.

#include "kshard/tensor_parallel/embedding.hpp"
#include "kshard/tensor_parallel/linear.hpp"
#include "kshard/tensor_parallel/region.hpp"
#include "kshard/tensor_parallel/tp_dim.hpp"
