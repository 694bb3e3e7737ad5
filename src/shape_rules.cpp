// The value-free rules (shape_rules.hpp): the checks the entry points make, on extents only.
#include "favor/shape_rules.hpp"

#include <string>

#include "core/validate.hpp"
#include "favor/error.hpp"

namespace favor {

void check_attention_shapes(const Shape4& q, const Shape4& k, const Shape4& v, bool causal,
                            const std::optional<std::array<int64_t, 2>>& key_mask_shape,
                            int64_t window, int64_t sinks) {
  static const float dummy = 0.0f;  // views that are never read: extents and strides only
  static const uint8_t keep = 1;
  const Shape4 zero{0, 0, 0, 0};
  std::optional<KeyMaskView> mask;
  if (key_mask_shape) {
    KeyMaskView m{};
    m.data = &keep;
    m.batch = (*key_mask_shape)[0];
    m.n = (*key_mask_shape)[1];
    mask = m;
  }
  const detail::AttentionShape s =
      detail::check_input_shapes(TensorView{&dummy, q, zero}, TensorView{&dummy, k, zero},
                                 TensorView{&dummy, v, zero}, causal, mask, false);
  detail::check_hybrid(window, sinks, s);
}

void check_key_mask_shape(int64_t mask_batch, int64_t mask_n, int64_t batch, int64_t n,
                          const char* n_name) {
  static const uint8_t keep = 1;
  KeyMaskView m{};
  m.data = &keep;
  m.batch = mask_batch;
  m.n = mask_n;
  detail::check_key_mask(m, batch, n, n_name);
}

void check_decoder_state_layout(const std::vector<int64_t>& sums,
                                const std::vector<int64_t>& log_max,
                                const std::vector<int64_t>& row_positions,
                                const std::vector<int64_t>& position, int64_t batch, int64_t heads,
                                int64_t features, int64_t dv) {
  auto dims = [](const std::vector<int64_t>& a) {
    std::string s = "[";
    for (size_t i = 0; i < a.size(); ++i) s += (i ? "," : "") + std::to_string(a[i]);
    return s + "]";
  };
  auto check = [&](const std::vector<int64_t>& got, const std::vector<int64_t>& want,
                   const char* name, const char* rule) {
    if (got != want)
      throw Error(std::string("state.") + name + ": shape " + dims(got) + " must be " + rule +
                  " = " + dims(want));
  };
  check(sums, {batch, heads, features, dv + 1}, "sums", "[batch, heads, features, dv + 1]");
  check(log_max, {batch, heads}, "log_max", "[batch, heads]");
  check(row_positions, {batch}, "row_positions", "[batch]");
  check(position, {1}, "position", "[1]");
}

}  // namespace favor
