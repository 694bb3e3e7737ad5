// Fuzz target: the library's entry points (favor_attention with a projection or a feature map,
// exact_attention, their backward passes, vq_attention and its backward pass, features) on
// fuzzed small shapes (each dim 0..8, B and H 0..3), strides (contiguous, padded, 0 =
// broadcast), key masks, options (kernel, causal, scale incl. 0 / negative / NaN / Inf, decay,
// VQ tau and block) and values from a palette with NaN, +-Inf, 0, denormals, +-1e30, +-1e-30,
// FLT_MAX and ordinary numbers. Properties (favor.hpp, docs/numerics.md):
//  - every call returns or throws favor::Error (any other exception is a finding);
//  - an input the call reads that is not finite (or an impossible option: scale <= 0, lambda
//    = 0, VQ tau in (0, 1e-30) or < 0, block < 0) must be refused (favor::Error);
//  - when the call returns and its values are bounded (kOutputBound below: the logits fit in
//    float32), every output is finite; the forward outputs of the kernels with
//    positive weights (exact, VQ, FAVOR with positive / hyperbolic / hedgehog / FAVOR++ /
//    FAVOR# features) lie in the convex hull of the values of their (batch, head), or are a
//    zero row (no visible key; underflowed denominator);
//  - gradients are checked finite only within tighter bounds (kGradBound, kGradMagnitude).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "favor/favor.hpp"
#include "fuzz_support.hpp"

namespace {

using favor::Shape4;
using favor::TensorView;
using favor::fuzz::ByteReader;

// Finite outputs are required while scale * max|x|^2 * D, over every value read (q, k, v, W,
// learned parameters, codebook), stays below kOutputBound: past it the logits (or the
// numerator sums) leave float32, where favor returns NaN without an error (reported in
// docs/reliability.md, inputs in fuzz/findings/attention/).
// Gradients: below kGradBound, and every value at most kGradMagnitude: favor's backward pass
// returns NaN from values of a few hundred (reported; fuzz/findings/attention/).
constexpr double kOutputBound = 1e30, kGradBound = 1e6, kGradMagnitude = 16;

// Ordinary values first, then the tails, then the non-finite ones (rarer: 3 of 32).
constexpr float kPalette[32] = {
    0.0f,  1.0f,   -1.0f, 0.5f,   -2.0f,   3.25f,    0.1f,    -0.7f,  1.5f,     -0.25f,   4.0f,
    -3.0f, 0.75f,  2.5f,  -1.75f, 0.3f,    1e-30f,   -1e-30f, 1e-40f, -1e-40f,  1e30f,    -1e30f,
    88.0f, -88.0f, 1e4f,  -1e4f,  FLT_MAX, -FLT_MAX, FLT_MIN, NAN,    INFINITY, -INFINITY};

// What the current input asked for, printed when a property fails.
std::string g_case;
void note(const std::string& text) {
  g_case += text + ' ';
}
std::string dims(const Shape4& s) {
  std::string text = "[";
  for (int a = 0; a < 4; ++a) text.append(a ? "," : "").append(std::to_string(s[a]));
  return text.append("]");
}

struct Checker {
  bool inputs_finite = true;
  double max_input = 0.0;  // largest |value| read
  void see(double x) {
    if (!std::isfinite(x))
      inputs_finite = false;
    else
      max_input = std::max(max_input, std::fabs(x));
  }
};

/// Values: a fuzzed pattern of 1..16 palette entries, repeated over the buffer.
std::vector<float> values(ByteReader& in, size_t count) {
  std::vector<uint8_t> pattern(1 + in.below(16));
  for (auto& p : pattern) p = in.below(32);
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = kPalette[pattern[i % pattern.size()]];
  return out;
}

/// A read-only view of `shape` with fuzzed strides (natural, padded or 0 per axis) over its
/// own buffer; every element the view reads goes to the checker.
struct FuzzView {
  std::vector<float> buffer;
  TensorView view;
  Checker values;  // of the elements the view reads
};

/// The checker of a call that reads these views besides the options.
Checker reading(Checker options, std::initializer_list<const FuzzView*> views) {
  for (const FuzzView* v : views) {
    options.inputs_finite = options.inputs_finite && v->values.inputs_finite;
    options.max_input = std::max(options.max_input, v->values.max_input);
  }
  return options;
}

FuzzView make_view(ByteReader& in, const Shape4& shape) {
  FuzzView f;
  const Shape4 natural = favor::contiguous_strides(shape);
  Shape4 strides;
  const uint8_t mode = in.byte();
  for (int a = 0; a < 4; ++a) {
    switch ((mode >> (2 * a)) & 3) {
      case 1:
        strides[a] = 0;
        break;  // broadcast
      case 2:
        strides[a] = natural[a] * 2 + 1;
        break;  // padded
      default:
        strides[a] = natural[a];
        break;
    }
  }
  int64_t extent = 1;
  bool empty = false;
  for (int a = 0; a < 4; ++a) {
    if (shape[a] == 0)
      empty = true;
    else
      extent += (shape[a] - 1) * strides[a];
  }
  f.buffer = values(in, static_cast<size_t>(extent));
  f.view = TensorView{f.buffer.data(), shape, strides};
  note(dims(shape) + "/strides" + dims(strides));
  static const bool dump = std::getenv("FAVOR_FUZZ_DUMP") != nullptr;  // the values too
  if (dump) {
    std::string text = "{";
    for (const float x : f.buffer) text += std::to_string(x) + ",";
    note(text + "}");
  }
  if (!empty) {
    for (int64_t b = 0; b < shape[0]; ++b)
      for (int64_t h = 0; h < shape[1]; ++h)
        for (int64_t n = 0; n < shape[2]; ++n)
          for (int64_t d = 0; d < shape[3]; ++d) f.values.see(f.view.at(b, h, n, d));
  }
  return f;
}

std::optional<double> pick_scale(ByteReader& in, Checker& check) {
  constexpr double kScales[] = {0.125, 1.0, 0.5, 4.0, 1e-30, 1e30, 0.0, -1.0, NAN, INFINITY};
  const uint8_t c = in.below(12);
  if (c >= 10) return std::nullopt;
  note("scale=" + std::to_string(kScales[c]));
  check.see(kScales[c]);
  if (!(kScales[c] > 0.0)) check.inputs_finite = false;  // 0 and negative must be refused too
  return kScales[c];
}

struct Mask {
  std::vector<uint8_t> bytes;
  std::optional<favor::KeyMaskView> view;
};

Mask make_mask(ByteReader& in, int64_t batch, int64_t n) {
  Mask m;
  const uint8_t c = in.below(8);
  if (c < 4) return m;
  favor::KeyMaskView v;
  v.batch = c == 7 ? batch + 1 : batch;  // 7: a wrong shape, to be refused
  v.n = n;
  v.stride_b = c == 5 ? 0 : n;
  v.stride_n = c == 6 ? 0 : 1;
  const size_t size = static_cast<size_t>(std::max<int64_t>(1, v.batch * std::max<int64_t>(n, 1)));
  const uint8_t density = in.byte();  // bit i: whether key pattern i is on
  m.bytes.resize(size);
  for (size_t i = 0; i < size; ++i) m.bytes[i] = (density >> (i % 8)) & 1;
  v.data = m.bytes.data();
  m.view = v;
  note("mask(mode " + std::to_string(c) + ", bits " + std::to_string(density) + ")");
  return m;
}

std::vector<double> make_decay(ByteReader& in, int64_t heads, Checker& check) {
  constexpr double kDecay[] = {1.0, 0.5, 0.99, 1e-30, 0.0, -0.5, 2.0, NAN};
  const uint8_t c = in.below(6);
  if (c < 3) return {};
  const int64_t count = c == 3 ? 1 : c == 4 ? heads : heads + 1;
  std::vector<double> decay(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (auto& g : decay) {
    g = kDecay[in.below(8)];
    check.see(g);
    note("decay=" + std::to_string(g));
  }
  return decay;
}

favor::Projection make_projection(ByteReader& in, int64_t m, int64_t d, Checker& check) {
  if (in.flag()) {
    favor::ProjectionOptions o;
    o.kind = static_cast<favor::ProjectionKind>(in.below(7));
    o.norms = static_cast<favor::NormMode>(in.below(3));
    o.seed = in.byte();
    note("W=draw(kind " + std::to_string(static_cast<int>(o.kind)) + ")");
    return favor::Projection::draw(m, d, o);
  }
  std::vector<float> w = values(in, static_cast<size_t>(std::max<int64_t>(m * d, 0)));
  for (const float x : w) check.see(x);
  note("W=matrix");
  return favor::Projection::from_matrix(m, d, std::move(w));
}

bool positive_weights(favor::Kernel k) {
  return k != favor::Kernel::trig;
}

bool tame(const Checker& c, std::optional<double> scale, int64_t d, double bound) {
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(d, 1)));
  return s * c.max_input * c.max_input * static_cast<double>(std::max<int64_t>(d, 1)) <= bound;
}

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_attention: %s\n  case: %s\n", what, g_case.c_str());
    std::abort();
  }
}

void require_finite(const std::vector<float>& x, const char* what) {
  for (const float e : x) require(std::isfinite(e), what);
}

/// y [B, H, Nq, Dv] in the hull of v [B, H, Nk, Dv] per (b, h) and column, or a zero row.
void require_in_hull(const favor::Tensor& y, const TensorView& v) {
  const Shape4& s = y.shape();
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h)
      for (int64_t i = 0; i < s[2]; ++i) {
        bool zero = true;
        for (int64_t c = 0; c < s[3]; ++c) zero = zero && y.at(b, h, i, c) == 0.0f;
        if (zero) continue;
        for (int64_t c = 0; c < s[3]; ++c) {
          double lo = INFINITY, hi = -INFINITY, big = 0.0;
          for (int64_t j = 0; j < v.shape[2]; ++j) {
            const double x = v.at(b, h, j, c);
            lo = std::min(lo, x), hi = std::max(hi, x), big = std::max(big, std::fabs(x));
          }
          const double tol = 1e-4 * big + 1e-30, yv = y.at(b, h, i, c);
          require(yv >= lo - tol && yv <= hi + tol, "output outside the convex hull of the values");
        }
      }
}

// dlambda = dL/dl * 2 / lambda (l = log lambda^2) is checked only while every |lambda| is at
// least kSmallestLambda: below, 2 / lambda alone is beyond 1e20 (an open finding,
// fuzz/findings/attention/learned_map_tiny_lambda_dlambda_inf.bin: lambda 1e-30 gave an
// infinite dlambda in the clang build, a finite one in the g++ build).
constexpr float kSmallestLambda = 1e-20f;

void require_grads_finite(const favor::AttentionGrads& g, bool check_dlambda = true) {
  require_finite(g.dq.values(), "dq not finite");
  require_finite(g.dk.values(), "dk not finite");
  require_finite(g.dv.values(), "dv not finite");
  require_finite(g.dw, "dw not finite");
  require_finite(g.dbias, "dbias not finite");
  if (check_dlambda) require_finite(g.dlambda, "dlambda not finite");
  for (const double x : g.ddecay) require(std::isfinite(x), "ddecay not finite");
}

void run(ByteReader& in) {
  Checker check;
  const uint8_t op = in.below(9);
  const int64_t B = in.below(4), H = in.below(4), Nq = in.below(9), D = in.below(9),
                Dv = in.below(9), m = in.below(9);
  const bool causal = in.flag();
  int64_t Nk = in.below(9);
  if (causal && in.below(4) != 0) Nk = Nq;  // mostly the lengths causal needs
  // Now and then one tensor's shape breaks the rules, which must be refused.
  Shape4 qs{B, H, Nq, D}, ks{B, H, Nk, D}, vs{B, H, Nk, Dv};
  const uint8_t bend = in.below(16);
  if (bend < 3) (bend == 0 ? qs : bend == 1 ? ks : vs)[in.below(4)] += 1;
  const FuzzView q = make_view(in, qs), k = make_view(in, ks), v = make_view(in, vs);
  const Mask mask = make_mask(in, B, Nk);
  const Shape4 ys{B, H, Nq, Dv};

  favor::AttentionOptions o;
  o.causal = causal;
  o.key_mask = mask.view;
  o.kernel = static_cast<favor::Kernel>(in.below(5));  // positive .. favorsharp
  o.scale = pick_scale(in, check);
  if (op == 0 || op == 1 || op == 3 || op == 4) o.decay = make_decay(in, H, check);
  note("op=" + std::to_string(op) + " causal=" + std::to_string(causal) +
       " kernel=" + favor::to_string(o.kernel) + " m=" + std::to_string(m));

  const std::optional<double> scale = o.scale;
  const auto outputs_bounded = [&] { return tame(check, scale, D, kOutputBound); };
  // FAVOR++ / FAVOR# gradients are checked causal and not (R overflowed where a key sum is
  // tiny: fixed, regressions/attention/favorsharp_backward_dk_nan.bin and
  // Stability.CausalFavorBackwardWithTinyPrefixSumsIsFinite).
  const auto grads_bounded = [&] {
    note("max|x|=" + std::to_string(check.max_input));
    return check.max_input <= kGradMagnitude && tame(check, scale, D, kGradBound);
  };
  switch (op) {
    case 0: {  // favor_attention with a projection
      const favor::Projection w = make_projection(in, m, D, check);
      const favor::Tensor y = favor::favor_attention(q.view, k.view, v.view, w, o);
      check = reading(check, {&q, &k, &v});
      require(check.inputs_finite, "favor_attention accepted an input it must refuse");
      if (!outputs_bounded()) break;
      require_finite(y.values(), "favor_attention: output not finite");
      if (positive_weights(o.kernel)) require_in_hull(y, v.view);
      break;
    }
    case 1:
    case 4: {  // with a learned feature map (forward or backward)
      favor::FeatureMap map(make_projection(in, m, D, check),
                            in.flag() ? favor::Kernel::hedgehog : o.kernel);
      map.scale = o.scale;
      o.kernel = favor::Kernel::positive;
      o.scale.reset();
      const uint8_t sets = in.below(4);
      map.heads = sets == 0 ? 1 : sets == 1 ? H : sets == 2 ? B * H : H + 1;
      note("map " + favor::to_string(map.kernel) + " heads=" + std::to_string(map.heads));
      const size_t per = static_cast<size_t>(std::max<int64_t>(map.heads * m, 0));
      const uint8_t learned = in.byte();
      if (learned & 1) map.weights = values(in, per * static_cast<size_t>(D));
      if (learned & 2) map.bias = values(in, per);
      if (learned & 4) map.lambda = values(in, per);
      note("learned=" + std::to_string(learned & 7));
      for (const float x : map.weights) check.see(x);
      for (const float x : map.bias) check.see(x);
      for (const float x : map.lambda) check.see(x), check.inputs_finite &= x != 0.0f;
      if (op == 1) {
        const favor::Tensor y = favor::favor_attention(q.view, k.view, v.view, map, o);
        check = reading(check, {&q, &k, &v});
        require(check.inputs_finite, "favor_attention(map) accepted an input it must refuse");
        if (!outputs_bounded()) break;
        require_finite(y.values(), "favor_attention(map): output not finite");
        if (positive_weights(map.kernel)) require_in_hull(y, v.view);
      } else {
        const FuzzView dy = make_view(in, ys);
        const auto g =
            favor::favor_attention_backward(q.view, k.view, v.view, dy.view, map, o, in.flag());
        check = reading(check, {&q, &k, &v, &dy});
        require(check.inputs_finite,
                "favor_attention_backward(map) accepted an input it must refuse");
        bool lambdas_tame = true;
        for (const float x : map.lambda) lambdas_tame &= std::abs(x) >= kSmallestLambda;
        if (grads_bounded()) require_grads_finite(g, lambdas_tame);
      }
      break;
    }
    case 2: {  // exact attention
      favor::ExactOptions e;
      e.causal = causal;
      e.scale = o.scale;
      e.key_mask = mask.view;
      e.accumulation = in.flag() ? favor::Accumulation::f64 : favor::Accumulation::f32;
      note(e.accumulation == favor::Accumulation::f64 ? "f64" : "f32");
      const favor::Tensor y = favor::exact_attention(q.view, k.view, v.view, e);
      check = reading(check, {&q, &k, &v});
      require(check.inputs_finite, "exact_attention accepted an input it must refuse");
      // No bound: logits or sums beyond float32 take the f64 path, so finite inputs give
      // finite outputs at any scale (regressions/attention/exact_scale_1e30_nan.bin).
      require_finite(y.values(), "exact_attention: output not finite");
      require_in_hull(y, v.view);
      break;
    }
    case 3: {  // favor_attention_backward with a projection
      const favor::Projection w = make_projection(in, m, D, check);
      const FuzzView dy = make_view(in, ys);
      const auto g =
          favor::favor_attention_backward(q.view, k.view, v.view, dy.view, w, o, in.flag());
      check = reading(check, {&q, &k, &v, &dy});
      require(check.inputs_finite, "favor_attention_backward accepted an input it must refuse");
      if (grads_bounded()) require_grads_finite(g);
      break;
    }
    case 5: {  // exact_attention_backward
      favor::ExactOptions e;
      e.causal = causal;
      e.scale = o.scale;
      e.key_mask = mask.view;
      const FuzzView dy = make_view(in, ys);
      const auto g = favor::exact_attention_backward(q.view, k.view, v.view, dy.view, e);
      check = reading(check, {&q, &k, &v, &dy});
      require(check.inputs_finite, "exact_attention_backward accepted an input it must refuse");
      if (grads_bounded()) require_grads_finite(g);
      break;
    }
    case 6:
    case 7: {  // vq_attention and its backward pass
      constexpr double kTau[] = {0.0, 0.0, 0.5, 2.0, 1e-31, 1e-30, 1e30, -1.0, NAN};
      favor::VQOptions vo;
      vo.causal = causal;
      vo.scale = o.scale;
      vo.key_mask = mask.view;
      vo.tau = kTau[in.below(9)];
      check.see(vo.tau);
      if (vo.tau < 0.0 || (vo.tau > 0.0 && vo.tau < 1e-30)) check.inputs_finite = false;
      vo.block = static_cast<int64_t>(in.below(5)) - 1;
      note("tau=" + std::to_string(vo.tau) + " block=" + std::to_string(vo.block));
      if (vo.block < 0) check.inputs_finite = false;
      const int64_t hc = in.flag() ? 1 : H, codes = in.below(5);
      const FuzzView cb = make_view(in, Shape4{1, hc, codes, D});
      if (op == 6) {
        const favor::Tensor y = favor::vq_attention(q.view, k.view, v.view, cb.view, vo);
        check = reading(check, {&q, &k, &v, &cb});
        require(check.inputs_finite, "vq_attention accepted an input it must refuse");
        if (!outputs_bounded()) break;
        require_finite(y.values(), "vq_attention: output not finite");
        require_in_hull(y, v.view);
      } else {
        const FuzzView dy = make_view(in, ys);
        const auto g =
            favor::vq_attention_backward(q.view, k.view, v.view, dy.view, cb.view, vo, in.flag());
        check = reading(check, {&q, &k, &v, &cb, &dy});
        require(check.inputs_finite, "vq_attention_backward accepted an input it must refuse");
        if (grads_bounded()) {
          require_finite(g.dq.values(), "vq dq not finite");
          require_finite(g.dk.values(), "vq dk not finite");
          require_finite(g.dv.values(), "vq dv not finite");
          require_finite(g.dcodebook.values(), "vq dcodebook not finite");
        }
      }
      break;
    }
    default: {  // features(): throws on overflow instead of returning Inf
      const favor::Projection w = make_projection(in, m, D, check);
      favor::FeatureOptions fo;
      fo.kernel = o.kernel;
      fo.scale = o.scale;
      if (favor::data_adapted(o.kernel) && in.flag()) fo.fit = favor::KernelFit::constant(-0.1, D);
      const favor::Tensor phi = favor::features(q.view, w, fo);
      check = reading(check, {&q});
      require(check.inputs_finite, "features accepted an input it must refuse");
      require_finite(phi.values(), "features: output not finite");  // it throws on overflow
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  favor::set_num_threads(1);  // deterministic replays; 2 cores are shared
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  g_case.clear();
  try {
    run(in);
  } catch (const favor::Error&) {
  } catch (const std::exception& e) {
    favor::fuzz::unexpected_exception("fuzz_attention", e.what());
  }
  return 0;
}
