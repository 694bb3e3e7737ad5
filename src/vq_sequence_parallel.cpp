// Sequence-parallel Transformer-VQ attention (favor/sequence_parallel.hpp): each rank
// validates its slice, the ranks agree (error messages, then the shapes, options and a hash
// of the codebook), and the per-code sums [Vsum | n] of the keys cross once (bidirectional:
// allreduce; causal: exclusive scan). The backward pass adds the query-side per-code sums
// [U | r | T | w] (bidirectional: allreduce, then the key pass; causal: both local sweeps,
// the reverse exclusive scan of the later ranks' sums, then their key pass).
//
// Every sum that crosses is a plain sum, no stabiliser: the key sums add key weights p_j in
// [0, 1] (one-hot or p(s|k)) times [v_j | 1], the query-side sums add normalised attention
// weights W_is in [0, 1] times dy_i, delta_i, q_i dy_i^T or delta_i q_i. The row shift of
// the stabilised code weights (cpu/vq_state.hpp) is computed by each rank after the key sums
// arrived, from the counts of every key the row sees, as in one process.
#include <algorithm>
#include <cmath>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "core/agreement.hpp"
#include "core/validate.hpp"
#include "core/vq_validate.hpp"
#include "favor/error.hpp"
#include "favor/sequence_parallel.hpp"
#include "kernels/backend.hpp"

namespace favor {
namespace {

constexpr const char* kWhat = "sequence-parallel VQ attention";
constexpr const char* kRule =
    "every rank must call with the same shapes (but N), options and codebook";

// What every rank must agree on, in this order (call_fields).
const std::vector<detail::AgreedField> kAgreed = {{"batch B", true},
                                                  {"heads H", true},
                                                  {"head dim D", true},
                                                  {"value dim Dv", true},
                                                  {"causal flag", false},
                                                  {"codes c", true},
                                                  {"codebook heads Hc", true},
                                                  {"key mask presence", false},
                                                  {"scale", false},
                                                  {"tau", false},
                                                  {"codebook", false},
                                                  {"codebook gradient", false},
                                                  {"call (forward or backward)", false}};

// One rank's validated call: the shapes and the kernel params, whose codebook points into
// `codebook` (a vector keeps its buffer when moved).
struct Call {
  detail::AttentionShape s{};
  std::vector<float> codebook;
  kernels::VQParams p{};
};

std::vector<int64_t> call_fields(const Call& c, const VQOptions& options, int64_t codebook_heads,
                                 bool grads, bool backward) {
  const int64_t values = static_cast<int64_t>(c.codebook.size());
  return {c.s.batch,
          c.s.heads,
          c.s.d,
          c.s.dv,
          options.causal ? 1 : 0,
          c.p.codes,
          codebook_heads,
          options.key_mask ? 1 : 0,
          static_cast<int64_t>(detail::bits_of(c.p.scale)),
          static_cast<int64_t>(detail::bits_of(options.tau)),
          static_cast<int64_t>(detail::hash_floats(c.codebook.data(), values)),
          grads ? 1 : 0,
          backward ? 1 : 0,
          c.s.nq,
          c.s.nk};
}

// Validates this rank's slice (Nq or Nk may be 0), dy and out when given.
Call validate(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dy,
              const MutableTensorView* out, const TensorView& codebook, const VQOptions& options) {
  Call c;
  c.p = detail::vq_params(q, k, v, codebook, options, c.codebook, &c.s, true);
  const Shape4 expected{c.s.batch, c.s.heads, c.s.nq, c.s.dv};
  if (dy) {
    detail::check_view(*dy, "dy", true);
    if (dy->shape != expected) {
      throw Error("dy: shape " + shape_string(dy->shape) +
                  " must be the output's shape [B, H, Nq, Dv] = " + shape_string(expected));
    }
    detail::check_finite(*dy, "dy");
  }
  if (out) {
    if (c.s.nq > 0) {
      detail::check_output(*out, expected, "out", {q, k, v, codebook});
    } else if (out->shape != expected) {
      throw Error("out: shape " + shape_string(out->shape) + " must be " + shape_string(expected));
    }
  }
  return c;
}

// Validation and agreement: what forward and backward calls share. reserve (optional)
// allocates the call's large buffers before the agreement (an allocation failure is then
// agreed like a broken rule).
Call prepare(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dy,
             const MutableTensorView* out, const TensorView& codebook, const VQOptions& options,
             bool grads, Exchange& ex, SequenceParallelStats& st,
             const std::function<void(const Call&)>& reserve = {}) {
  std::string error;
  std::optional<Call> call;
  try {
    call.emplace(validate(q, k, v, dy, out, codebook, options));
    if (reserve) reserve(*call);
  } catch (const std::bad_alloc&) {
    error = "out of memory for this rank's slice";
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "invalid input";
  }
  detail::agree_on_errors(ex, error, kWhat, st);
  const std::vector<int64_t> lengths = detail::agree_on_fields(
      ex, call_fields(*call, options, codebook.shape[1], grads, dy != nullptr), kAgreed, kWhat,
      kRule, st);
  detail::slice_positions(lengths, ex.rank(), options.causal, kWhat, st);
  Call c = std::move(*call);
  c.p.codebook = c.codebook.data();
  return c;
}

// Exclusive scan of per-head plain sums (heads x size floats) in rank order (reverse: of the
// later ranks). StateBlock records with max 0: combine_states scales both by exp(0) = 1, so
// the scan adds them; the empty records of the first rank are zeros.
void exscan_sums(std::vector<float>& sums, int64_t heads, int64_t size, bool reverse, double length,
                 Exchange& ex, SequenceParallelStats& st) {
  StateBlock block(heads, size);
  for (int64_t h = 0; h < heads; ++h) {
    block.header(h).max = 0.0;
    block.header(h).length = length;
    std::copy_n(sums.data() + h * size, size, block.state(h));
  }
  ex.exscan_states(block, reverse);
  ++st.collectives;
  st.payload_bytes += block.bytes();
  for (int64_t h = 0; h < heads; ++h) {
    float* dst = sums.data() + h * size;
    if (std::isinf(block.header(h).max)) {
      std::fill(dst, dst + size, 0.0f);
    } else {
      std::copy_n(block.state(h), size, dst);
    }
  }
}

// Per head [Vsum | n] of this rank's keys combined over ranks: bidirectional, of every rank's
// keys (allreduce); causal, of the earlier ranks' keys (exclusive scan).
std::vector<float> key_sums_over_ranks(const kernels::VQParams& p, const Call& c, bool causal,
                                       Exchange& ex, SequenceParallelStats& st) {
  const int64_t heads = c.s.batch * c.s.heads, size = p.codes * (c.s.dv + 1);
  std::vector<float> sums(static_cast<size_t>(heads * size), 0.0f);
  if (c.s.nk > 0) kernels::backend().vq_key_states(p, sums.data());
  if (causal) {
    exscan_sums(sums, heads, size, false, static_cast<double>(c.s.nk), ex, st);
  } else {
    ex.allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
    ++st.collectives;
    st.payload_bytes += static_cast<int64_t>(sums.size() * sizeof(float));
  }
  return sums;
}

}  // namespace

SequenceParallelStats sequence_parallel_vq_attention(TensorView q, TensorView k, TensorView v,
                                                     TensorView codebook, MutableTensorView out,
                                                     const VQOptions& options, Exchange& exchange) {
  SequenceParallelStats st;
  Call c = prepare(q, k, v, nullptr, &out, codebook, options, false, exchange, st);
  c.p.base.out = out.data;
  c.p.base.out_strides = out.strides;
  const std::vector<float> keys = key_sums_over_ranks(c.p, c, options.causal, exchange, st);
  c.p.init_states = keys.data();
  if (c.s.nq > 0)
    st.zero_rows = options.causal ? kernels::backend().vq_causal(c.p)
                                  : kernels::backend().vq_bidirectional(c.p);
  return st;
}

VQGrads sequence_parallel_vq_attention_backward(TensorView q, TensorView k, TensorView v,
                                                TensorView dy, TensorView codebook,
                                                const VQOptions& options, Exchange& exchange,
                                                bool with_codebook_grad,
                                                SequenceParallelStats* stats) {
  SequenceParallelStats st;
  VQGrads g;
  const auto reserve = [&](const Call& c) {
    g.dq = Tensor({c.s.batch, c.s.heads, c.s.nq, c.s.d});
    g.dk = Tensor({c.s.batch, c.s.heads, c.s.nk, c.s.d});
    g.dv = Tensor({c.s.batch, c.s.heads, c.s.nk, c.s.dv});
  };
  Call c =
      prepare(q, k, v, &dy, nullptr, codebook, options, with_codebook_grad, exchange, st, reserve);
  kernels::VQBackwardParams bp{};
  bp.fwd = c.p;
  // vq_attention_backward's default block: its hard-VQ moment update is a GEMM with K = L.
  if (options.block == 0) bp.fwd.block = kernels::backend().tuning().vq_backward_block;
  bp.dy = dy.data;
  bp.dy_strides = dy.strides;
  bp.dq = g.dq.data();
  bp.dk = g.dk.data();
  bp.dv = g.dv.data();
  if (with_codebook_grad) {
    g.dcodebook = Tensor({1, codebook.shape[1], codebook.shape[2], c.s.d});
    bp.dcodebook = g.dcodebook.data();
  }
  const std::vector<float> keys = key_sums_over_ranks(bp.fwd, c, options.causal, exchange, st);
  bp.fwd.init_states = keys.data();
  // This rank's queries: dq, the logit part of dC, their per-code sums (and, causal, their
  // part of dk and dv); then the sums of the other ranks' queries that see this rank's keys.
  const int64_t heads = c.s.batch * c.s.heads, size = kernels::backend().vq_code_sums_size(bp.fwd);
  std::vector<float> sums(static_cast<size_t>(heads * size), 0.0f);
  bp.code_sums_out = sums.data();
  if (c.s.nq > 0) {
    if (options.causal) {
      kernels::backend().vq_backward_causal(bp);
    } else {
      kernels::backend().vq_backward_bidirectional(bp);
    }
  }
  bp.code_sums_out = nullptr;
  if (options.causal) {
    exscan_sums(sums, heads, size, true, static_cast<double>(c.s.nk), exchange, st);
  } else {
    exchange.allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
    ++st.collectives;
    st.payload_bytes += static_cast<int64_t>(sums.size() * sizeof(float));
  }
  if (c.s.nk > 0) kernels::backend().vq_backward_keys(bp, sums.data());
  if (stats) *stats = st;
  return g;
}

}  // namespace favor
