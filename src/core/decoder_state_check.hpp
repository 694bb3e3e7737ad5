#pragma once
// Checks of a decoder state handed to load_state, and of the rows handed to select. Each
// throws favor::Error naming the argument, its value and the rule.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "favor/decoder_state.hpp"

namespace favor::detail {

/// `state` fits a Decoder of these extents: extents equal, array sizes match them,
/// row_positions in [0, position], sums finite, log_max finite or -inf (then sums zero).
void check_decoder_state(const DecoderState& state, int64_t batch, int64_t heads, int64_t features,
                         int64_t dv);
/// `state` fits a VQDecoder of these extents: extents equal, array sizes match them, sums
/// finite, counts finite and >= 0.
void check_vq_decoder_state(const VQDecoderState& state, int64_t batch, int64_t heads,
                            int64_t codes, int64_t dv);
/// select(indices): at least one index, each in [0, batch).
void check_row_indices(const std::vector<int64_t>& indices, int64_t batch);

/// Rows indices[0], indices[1], ... of `rows` (each of row_size elements), in that order.
template <class T>
std::vector<T> select_rows(const std::vector<T>& rows, int64_t row_size,
                           const std::vector<int64_t>& indices) {
  std::vector<T> out;
  out.reserve(indices.size() * static_cast<size_t>(row_size));
  for (int64_t i : indices)
    out.insert(out.end(), rows.begin() + i * row_size, rows.begin() + (i + 1) * row_size);
  return out;
}

}  // namespace favor::detail
