#include "core/validate.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <utility>

#include "core/helper_threads.hpp"
#include "favor/error.hpp"
#include "favor/runtime.hpp"

namespace favor::detail {
namespace {

// Byte range [lo, hi) spanned by a view (strides >= 0).
std::pair<uintptr_t, uintptr_t> span_of(const float* data, const Shape4& shape,
                                        const Shape4& strides) {
  int64_t last = 0;
  for (int i = 0; i < 4; ++i) last += (shape[i] - 1) * strides[i];
  auto lo = reinterpret_cast<uintptr_t>(data);
  return {lo, lo + static_cast<uintptr_t>(last + 1) * sizeof(float)};
}

}  // namespace

void check_view(const TensorView& t, const std::string& name) {
  check_view(t, name, false);
}

void check_view(const TensorView& t, const std::string& name, bool empty_n) {
  if (empty_n && t.shape[2] == 0) {  // an empty slice: the other extents still count
    for (int i : {0, 1, 3}) {
      if (t.shape[i] < 1) {
        throw Error(name + ": shape " + shape_string(t.shape) +
                    " must have B, H and D >= 1 (layout [B, H, N, D]; N may be 0 for a slice)");
      }
    }
    return;
  }
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 1) {
      throw Error(name + ": shape " + shape_string(t.shape) +
                  " must have every extent >= 1 (layout [B, H, N, D])");
    }
    if (t.strides[i] < 0) {
      throw Error(name + ": strides " + shape_string(t.strides) + " must be non-negative");
    }
  }
  if (t.data == nullptr) throw Error(name + ": data pointer is null");
}

// An integer OR-reduction over the exponent bits, which the compiler vectorises (a float test
// would not be).
bool any_nonfinite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad != 0;
}

void check_dy(const TensorView& dy, const AttentionShape& s) {
  check_view(dy, "dy");
  const Shape4 expected{s.batch, s.heads, s.nq, s.dv};
  if (dy.shape != expected) {
    throw Error("dy: shape " + shape_string(dy.shape) +
                " must be the output's shape [B, H, Nq, Dv] = " + shape_string(expected));
  }
  check_finite(dy, "dy");
}

Tensor attention_output(const TensorView& q, const TensorView& v) {
  check_view(q, "q");
  check_view(v, "v");
  return Tensor({q.shape[0], q.shape[1], q.shape[2], v.shape[3]});
}

namespace {

// True if slice (b, h) of t holds a NaN or Inf: one scan of the slice when its rows are
// contiguous, else row by row (element by element when D is strided).
bool slice_nonfinite(const TensorView& t, int64_t b, int64_t h) {
  const int64_t n = t.shape[2], d = t.shape[3];
  if (n == 0) return false;  // an empty slice (a rank's share of a short sequence)
  if (t.strides[3] == 1 && (t.strides[2] == d || n == 1))
    return any_nonfinite(&t.at(b, h, 0, 0), n * d);
  for (int64_t i = 0; i < n; ++i) {
    if (t.strides[3] == 1) {
      if (any_nonfinite(&t.at(b, h, i, 0), d)) return true;
      continue;
    }
    for (int64_t x = 0; x < d; ++x)
      if (!std::isfinite(t.at(b, h, i, x))) return true;
  }
  return false;
}

// Below this many elements the check stays on the calling thread (a decode step's inputs).
constexpr int64_t kParallelCheckElements = int64_t{1} << 16;

}  // namespace

void check_finite(const TensorView& t, const std::string& name) {
  // The scan over (batch, head) slices on favor's threads (an input of N = 8192 tokens, 8
  // heads of 64 is 16 MB); only when one holds a non-finite value does the element-wise pass
  // below find the first, in index order, for the message.
  const int64_t slices = t.shape[0] * t.shape[1];
  const int64_t elements = slices * t.shape[2] * t.shape[3];
  // (one thread under a load, as the kernels' regions: cpu/team.hpp)
  const int team = slices > 1 && elements >= kParallelCheckElements ? helper_team() : 1;
  bool bad = false;
#pragma omp parallel for num_threads(team) schedule(static) reduction(|| : bad) if (team > 1)
  for (int64_t s = 0; s < slices; ++s)
    bad = bad || slice_nonfinite(t, s / t.shape[1], s % t.shape[1]);
  team_ran(team);
  if (!bad) return;
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t h = 0; h < t.shape[1]; ++h)
      for (int64_t n = 0; n < t.shape[2]; ++n) {
        if (t.strides[3] == 1 && !any_nonfinite(&t.at(b, h, n, 0), t.shape[3])) continue;
        for (int64_t x = 0; x < t.shape[3]; ++x) {
          const float value = t.at(b, h, n, x);
          if (!std::isfinite(value)) {
            std::ostringstream os;
            os << name << ": element [" << b << ',' << h << ',' << n << ',' << x << "] is " << value
               << "; inputs must be finite (no NaN or Inf)";
            throw Error(os.str());
          }
        }
      }
}

void check_step(const TensorView& t, int64_t batch, int64_t heads, int64_t dim,
                const std::string& name, const std::string& dim_name) {
  check_view(t, name);
  if (t.shape[0] != batch || t.shape[1] != heads || t.shape[3] != dim) {
    throw Error(name + ": shape " + shape_string(t.shape) + " must be [B, H, T, " + dim_name +
                "] = [" + std::to_string(batch) + ',' + std::to_string(heads) + ",T," +
                std::to_string(dim) + ']');
  }
  check_finite(t, name);
}

void check_decode_step(const TensorView& q, const TensorView& k, const TensorView& v,
                       const MutableTensorView& out, const std::optional<KeyMaskView>& key_mask,
                       int64_t batch, int64_t heads, int64_t d, int64_t dv) {
  check_step(q, batch, heads, d, "q", "D");
  check_step(k, batch, heads, d, "k", "D");
  check_step(v, batch, heads, dv, "v", "Dv");
  for (const auto& [t, name] : {std::pair{q, "q"}, {k, "k"}, {v, "v"}}) {
    if (t.shape[2] != 1) {
      throw Error(std::string(name) + " " + shape_string(t.shape) +
                  ": a step takes one token per row (T = 1)");
    }
  }
  if (key_mask) check_key_mask(*key_mask, batch, 1, "T");
  check_output(out, {batch, heads, 1, dv}, "out", {q, k, v});
}

int64_t check_decode_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                             const MutableTensorView& out,
                             const std::optional<KeyMaskView>& key_mask, int64_t batch,
                             int64_t heads, int64_t d, int64_t dv) {
  check_step(q, batch, heads, d, "q", "D");
  check_step(k, batch, heads, d, "k", "D");
  check_step(v, batch, heads, dv, "v", "Dv");
  const int64_t T = q.shape[2];
  if (k.shape[2] != T || v.shape[2] != T) {
    throw Error("q " + shape_string(q.shape) + ", k " + shape_string(k.shape) + ", v " +
                shape_string(v.shape) + ": same token count T");
  }
  if (key_mask) check_key_mask(*key_mask, batch, T, "T");
  check_output(out, {batch, heads, T, dv}, "out", {q, k, v});
  return T;
}

void check_output(const MutableTensorView& out, const Shape4& expected, const std::string& name,
                  std::initializer_list<TensorView> inputs) {
  if (out.shape != expected) {
    throw Error(name + ": shape " + shape_string(out.shape) + " must be " + shape_string(expected));
  }
  check_view(TensorView{out.data, out.shape, out.strides}, name);
  for (int i = 0; i < 4; ++i) {
    if (out.shape[i] > 1 && out.strides[i] == 0) {
      throw Error(
          name + ": strides " + shape_string(out.strides) +
          " have a zero stride on an axis of extent > 1; an output's elements must not alias");
    }
  }
  auto [olo, ohi] = span_of(out.data, out.shape, out.strides);
  for (const TensorView& in : inputs) {
    auto [ilo, ihi] = span_of(in.data, in.shape, in.strides);
    if (olo < ihi && ilo < ohi) throw Error(name + ": output memory must not overlap an input");
  }
}

double resolve_scale(const std::optional<double>& scale, int64_t d) {
  if (!scale) return 1.0 / std::sqrt(static_cast<double>(d));
  if (!(std::isfinite(*scale) && *scale > 0.0)) {
    std::ostringstream os;
    os << "scale: " << *scale << " must be finite and > 0";
    throw Error(os.str());
  }
  return *scale;
}

void check_projection(const Projection& w, int64_t d, const std::string& name) {
  if (w.m() < 1) throw Error("projection: m = " + std::to_string(w.m()) + " must be >= 1");
  if (w.d() != d) {
    throw Error("projection: d = " + std::to_string(w.d()) +
                " must equal the head dim D = " + std::to_string(d) + " of " + name);
  }
}

AttentionShape check_attention_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                      bool causal, const std::optional<KeyMaskView>& mask) {
  return check_inputs(q, k, v, causal, mask, false);
}

AttentionShape check_slice_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                  bool causal, const std::optional<KeyMaskView>& mask) {
  return check_inputs(q, k, v, causal, mask, true);
}

void check_key_mask(const KeyMaskView& mask, int64_t batch, int64_t n, const char* n_name) {
  if (mask.data == nullptr && n > 0) throw Error("key_mask: data pointer is null");
  if (mask.batch != batch || mask.n != n) {
    throw Error("key_mask: shape [" + std::to_string(mask.batch) + ',' + std::to_string(mask.n) +
                "] must be [B, " + n_name + "] = [" + std::to_string(batch) + ',' +
                std::to_string(n) + ']');
  }
  if (mask.stride_b < 0 || mask.stride_n < 0) throw Error("key_mask: strides must be non-negative");
}

AttentionShape check_input_shapes(const TensorView& q, const TensorView& k, const TensorView& v,
                                  bool causal, const std::optional<KeyMaskView>& mask,
                                  bool empty_n) {
  check_view(q, "q", empty_n);
  check_view(k, "k", empty_n);
  check_view(v, "v", empty_n);
  const std::string qs = shape_string(q.shape), ks = shape_string(k.shape),
                    vs = shape_string(v.shape);
  if (q.shape[0] != k.shape[0] || q.shape[1] != k.shape[1] || v.shape[0] != k.shape[0] ||
      v.shape[1] != k.shape[1]) {
    throw Error("q " + qs + ", k " + ks + ", v " + vs + ": batch B and heads H must agree");
  }
  if (q.shape[3] != k.shape[3]) {
    throw Error("q " + qs + ", k " + ks + ": q and k must have the same head dim D");
  }
  if (v.shape[2] != k.shape[2]) {
    throw Error("k " + ks + ", v " + vs + ": k and v must have the same length Nk");
  }
  if (causal && q.shape[2] != k.shape[2]) {
    throw Error("q " + qs + ", k " + ks + ": causal attention needs Nq == Nk");
  }
  if (mask) check_key_mask(*mask, k.shape[0], k.shape[2], "Nk");
  return {q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]};
}

AttentionShape check_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                            bool causal, const std::optional<KeyMaskView>& mask, bool empty_n) {
  const AttentionShape shape = check_input_shapes(q, k, v, causal, mask, empty_n);
  check_finite(q, "q");
  check_finite(k, "k");
  check_finite(v, "v");
  return shape;
}

void check_hybrid(int64_t window, int64_t sinks, const AttentionShape& s) {
  if (window < 0) throw Error("window: " + std::to_string(window) + " must be >= 0");
  if (sinks < 0) throw Error("sinks: " + std::to_string(sinks) + " must be >= 0");
  if ((window > 0 || sinks > 0) && s.nq != s.nk) {
    throw Error("window, sinks: hybrid attention needs q and k of one sequence (Nq == Nk); Nq = " +
                std::to_string(s.nq) + ", Nk = " + std::to_string(s.nk));
  }
}

void check_window_options(const ExactOptions& options, const AttentionShape& s) {
  check_hybrid(options.window, options.sinks, s);
  if (options.accumulation == Accumulation::f64) {
    throw Error(
        "accumulation: f64 is not available with window or sinks (the window's kernel "
        "accumulates in f32)");
  }
}

}  // namespace favor::detail
