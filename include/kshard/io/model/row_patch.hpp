#pragma once

/// \file
/// The rows of a matrix a conversion writes over the same rows of a tensor, as bytes
/// (`io::patch_rows` in kshard/io/row_patch.hpp makes one from a distributed matrix).

#include <cstddef>
#include <string>
#include <vector>

#include "kshard/index.hpp"
#include "kshard/io/model/dtype.hpp"

namespace kshard::io {

/// Rows `ids` (sorted, unique) of a `rows x cols` matrix of `dtype`, as bytes: row `ids[k]` at
/// `k * cols * element size`.
struct RowPatch {
  std::string name;              ///< the tensor it writes over
  Dtype dtype = Dtype::F32;      ///< the matrix's element type
  index_t rows = 0;              ///< the matrix's rows
  index_t cols = 0;              ///< the matrix's columns
  std::vector<index_t> ids;      ///< the rows, sorted and unique
  std::vector<std::byte> bytes;  ///< their values, row-major
};

}  // namespace kshard::io
