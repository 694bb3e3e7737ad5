#include "core/decoder_state_check.hpp"

#include <cmath>
#include <string>

#include "favor/error.hpp"

namespace favor::detail {
namespace {

std::string str(int64_t x) {
  return std::to_string(x);
}

void check_extent(int64_t got, int64_t want, const char* name) {
  if (got != want) {
    throw Error(std::string("state.") + name + ": " + str(got) + " must equal the decoder's " +
                name + " " + str(want));
  }
}

void check_size(size_t got, int64_t want, const char* name, const char* rule) {
  if (static_cast<int64_t>(got) != want) {
    throw Error(std::string("state.") + name + ": " + str(static_cast<int64_t>(got)) +
                " values must be " + rule + " = " + str(want));
  }
}

template <class T>
void check_finite_values(const std::vector<T>& a, const char* name) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) {
      throw Error(std::string("state.") + name + "[" + std::to_string(i) +
                  "]: " + std::to_string(a[i]) + " must be finite");
    }
  }
}

void check_position(int64_t position) {
  if (position < 0) throw Error("state.position: " + str(position) + " must be >= 0");
}

}  // namespace

void check_decoder_state(const DecoderState& s, int64_t batch, int64_t heads, int64_t features,
                         int64_t dv) {
  check_extent(s.batch, batch, "batch");
  check_extent(s.heads, heads, "heads");
  check_extent(s.features, features, "features");
  check_extent(s.dv, dv, "dv");
  const int64_t head_size = features * (dv + 1);
  check_size(s.sums.size(), batch * heads * head_size, "sums",
             "batch * heads * features * (dv + 1)");
  check_size(s.log_max.size(), batch * heads, "log_max", "batch * heads");
  check_size(s.row_positions.size(), batch, "row_positions", "batch");
  check_position(s.position);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t p = s.row_positions[static_cast<size_t>(b)];
    if (p < 0 || p > s.position) {
      throw Error("state.row_positions[" + str(b) + "]: " + str(p) +
                  " must be in [0, position = " + str(s.position) + "]");
    }
  }
  check_finite_values(s.sums, "sums");
  for (int64_t bh = 0; bh < batch * heads; ++bh) {
    const double x = s.log_max[static_cast<size_t>(bh)];
    if (std::isnan(x) || x == INFINITY) {
      throw Error("state.log_max[" + str(bh) + "]: " + std::to_string(x) +
                  " must be finite or -inf (no key yet)");
    }
    if (!std::isinf(x)) continue;
    for (int64_t i = 0; i < head_size; ++i) {
      if (s.sums[static_cast<size_t>(bh * head_size + i)] != 0.0f) {
        throw Error("state.sums: head " + str(bh) +
                    " has log_max -inf (no key yet), so its sums must be all zero");
      }
    }
  }
}

void check_vq_decoder_state(const VQDecoderState& s, int64_t batch, int64_t heads, int64_t codes,
                            int64_t dv) {
  check_extent(s.batch, batch, "batch");
  check_extent(s.heads, heads, "heads");
  check_extent(s.codes, codes, "codes");
  check_extent(s.dv, dv, "dv");
  check_size(s.sums.size(), batch * heads * codes * dv, "sums", "batch * heads * codes * dv");
  check_size(s.counts.size(), batch * heads * codes, "counts", "batch * heads * codes");
  check_position(s.position);
  check_finite_values(s.sums, "sums");
  check_finite_values(s.counts, "counts");
  for (size_t i = 0; i < s.counts.size(); ++i) {
    if (s.counts[i] < 0.0f) {
      throw Error("state.counts[" + std::to_string(i) + "]: " + std::to_string(s.counts[i]) +
                  " must be >= 0");
    }
  }
}

void check_row_indices(const std::vector<int64_t>& indices, int64_t batch) {
  if (indices.empty()) throw Error("indices: empty; the new batch len(indices) must be >= 1");
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= batch) {
      throw Error("indices[" + std::to_string(i) + "]: " + str(indices[i]) +
                  " must be in [0, batch = " + str(batch) + ")");
    }
  }
}

}  // namespace favor::detail
