#pragma once
// Reading a slice along the sequence axis N of .npy inputs, by byte offset: only the rows a
// process holds are read (favor attention --distributed). Inputs are C-order float32 or
// float64 [N, X] or [B, H, N, X], masks bool or integer [N] or [B, N]; every (batch, head) of
// a slice is one contiguous run of rows in the file.
#include <cstdint>
#include <string>
#include <vector>

#include "favor/tensor.hpp"
#include "io_names.hpp"

namespace favor::cli {

/// An input's header with its shape as [B, H, N, X] (rank 2: B = H = 1). Throws
/// favor::Error for a dtype other than float32/float64, Fortran order, or a rank not 2 or 4.
struct RowsFile {
  std::string path, argument;
  NpyHeader header;
  size_t rank = 4;
  Shape4 shape{};
};
RowsFile open_rows(const std::string& path, const std::string& argument);

/// Rows [begin, end) along N of every (batch, head): a [B, H, end - begin, X] float tensor.
/// Throws favor::Error naming the first value that is NaN or Inf (or a float64 beyond float32's
/// range) at its position in the file, [b, h, n, x] or [n, x].
Tensor read_rows(const RowsFile& file, int64_t begin, int64_t end);

/// Positions [begin, end) of a key mask [N] (input rank 2) or [B, N] (rank 4) with
/// N = nk: flags [B][end - begin] (nonzero -> 1).
std::vector<uint8_t> read_mask_columns(const std::string& path, size_t input_rank, int64_t batch,
                                       int64_t nk, int64_t begin, int64_t end);

}  // namespace favor::cli
