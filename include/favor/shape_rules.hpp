#pragma once
/// \file shape_rules.hpp
/// The rules of favor's calls that read no values, for code that checks inputs it does not
/// hand to these C++ kernels (the Python package's torch kernels of other devices): the same
/// favor::Error, the same message, as the C++ entry points give.
#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "favor/tensor.hpp"

namespace favor {

/// The shape rules of an attention call: q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv]
/// with every extent >= 1, B and H agreeing, q and k sharing D, k and v sharing Nk, Nq == Nk
/// when causal, and a key mask of shape [B, Nk] (key_mask_shape: its extents); hybrid
/// attention's window and sinks (AttentionOptions::window, ::sinks: >= 0, Nq == Nk when
/// either is above 0).
void check_attention_shapes(const Shape4& q, const Shape4& k, const Shape4& v, bool causal,
                            const std::optional<std::array<int64_t, 2>>& key_mask_shape = {},
                            int64_t window = 0, int64_t sinks = 0);

/// A key mask's shape [mask_batch, mask_n] against [batch, n] (n_name: "Nk" for attention,
/// "T" for a decoder's tokens).
void check_key_mask_shape(int64_t mask_batch, int64_t mask_n, int64_t batch, int64_t n,
                          const char* n_name);

/// The layout of a decoder state (DecoderState: sums [B, H, F, Dv + 1], log_max [B, H],
/// row_positions [B], position [1]) against a decoder's extents, each array's extents given.
/// Its values are checked where they are read (Decoder::load_state).
void check_decoder_state_layout(const std::vector<int64_t>& sums,
                                const std::vector<int64_t>& log_max,
                                const std::vector<int64_t>& row_positions,
                                const std::vector<int64_t>& position, int64_t batch, int64_t heads,
                                int64_t features, int64_t dv);

}  // namespace favor
