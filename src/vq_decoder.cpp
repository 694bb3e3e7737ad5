// Streaming Transformer-VQ decoding (math.md s.6). Per (batch, head) the state is, per code
// s, the count n_s of the keys assigned to it and the sum of their values (soft VQ: both
// weighted by p(s|k)). A query attends to the codes: y = sum_s e_s sums_s / sum_s e_s n_s
// with e_s = exp(scale q.C_s - m). That is exact softmax attention over the quantised keys
// of every token appended so far, in O(c (D + Dv)) per token and head whatever the position.
//
// The batch causal kernel splits the sequence into blocks of L tokens and attends directly
// to the open block, because a query there must not see the later keys of its own block.
// A decoder appends token i before it queries row i and every appended token precedes every
// later query: its blocks have length L = 1, the cache alone is exact, and no open block is
// kept.
#include "favor/vq_decoder.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/validate.hpp"
#include "core/vq_validate.hpp"
#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/schedule.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/vq_assign.hpp"
#include "favor/error.hpp"
#include "favor/runtime.hpp"

namespace favor {
namespace {

// Per-thread buffers of append: a tile of keys and values gathered contiguous, and the
// tile's scores against every code (hard: nearness; soft: log p then p).
struct AppendSpace {
  std::vector<float> x, v, scores;
  std::vector<int32_t> z;
  AppendSpace(int64_t rows, int64_t d, int64_t dv, int64_t codes)
      : x(rows * d), v(rows * dv), scores(rows * codes), z(rows) {}
};

// Per-thread buffers of query: a tile of queries, their logits, and per row the weights
// e_s and the output.
struct QuerySpace {
  std::vector<float> x, logits, log_counts, e, y;
  QuerySpace(int64_t rows, int64_t d, int64_t dv, int64_t codes)
      : x(rows * d), logits(rows * codes), log_counts(codes), e(codes), y(dv) {}
};

}  // namespace

VQDecoder::VQDecoder(int64_t batch, int64_t heads, int64_t dv, TensorView codebook,
                     const VQDecoderOptions& options)
    : batch_(batch), heads_(heads), dv_(dv), codes_(0), d_(0), cb_heads_(0), options_(options) {
  if (batch < 1) throw Error("batch: " + std::to_string(batch) + " must be >= 1");
  if (heads < 1) throw Error("heads: " + std::to_string(heads) + " must be >= 1");
  if (dv < 1) throw Error("dv: " + std::to_string(dv) + " must be >= 1");
  // The codebook fixes D: keys and queries are checked against it.
  detail::check_codebook(codebook, heads, codebook.shape[3]);
  detail::check_vq_options(options.tau, 0);
  cb_heads_ = codebook.shape[1];
  codes_ = codebook.shape[2];
  d_ = codebook.shape[3];
  scale_ = detail::resolve_scale(options.scale, d_);
  codebook_ = detail::contiguous_codebook(codebook);
  auto tables = std::make_shared<std::vector<cpu::CodeTable>>();
  for (int64_t g = 0; g < cb_heads_; ++g)
    tables->push_back(cpu::code_table(codebook_.data() + g * codes_ * d_, codes_, d_));
  tables_ = std::move(tables);
  sums_.assign(static_cast<size_t>(batch * heads * codes_ * dv), 0.0f);
  counts_.assign(static_cast<size_t>(batch * heads * codes_), 0.0f);
}

void VQDecoder::reset() {
  std::fill(sums_.begin(), sums_.end(), 0.0f);
  std::fill(counts_.begin(), counts_.end(), 0.0f);
  position_ = 0;
}

void VQDecoder::append(TensorView k, TensorView v, const std::optional<KeyMaskView>& key_mask) {
  detail::check_step(k, batch_, heads_, d_, "k", "D");
  detail::check_step(v, batch_, heads_, dv_, "v", "Dv");
  if (k.shape[2] != v.shape[2]) {
    throw Error("k " + shape_string(k.shape) + ", v " + shape_string(v.shape) +
                ": same token count T");
  }
  if (key_mask) detail::check_key_mask(*key_mask, batch_, k.shape[2], "T");
  const int64_t T = k.shape[2], c = codes_, d = d_, dv = dv_, heads = batch_ * heads_;
  const bool soft = options_.tau > 0.0;
  const float tau = static_cast<float>(options_.tau);
  // Tiles of rows bound the scratch (rows x c) for a long prefill.
  const int64_t rows = std::min(T, cpu::kRowTile);
  const double work = double(T) * (2.0 * c * d + (soft ? 2.0 * c * dv : double(dv)));
  const int threads = cpu::threads_for(heads, work, num_threads());
  std::vector<AppendSpace> spaces = cpu::make_workspaces<AppendSpace>(threads, rows, d, dv, c);
  cpu::for_each_head(cpu::heads_only(heads, threads), spaces, [&](int64_t bh, AppendSpace& ws) {
    const int64_t b = bh / heads_, h = bh % heads_, g = cb_heads_ == 1 ? 0 : h;
    const cpu::CodeTable& table = (*tables_)[g];
    float* sums = sums_.data() + bh * c * dv;
    float* counts = counts_.data() + bh * c;
    // The tokens that take part, in tiles: a masked token is skipped, so a masked append
    // equals an append of the kept tokens alone (same tiles).
    int64_t next = 0;
    while (next < T) {
      int64_t n = 0;
      if (!key_mask) {
        n = std::min(rows, T - next);
        cpu::gather_rows(&k.at(b, h, next, 0), k.strides[2], k.strides[3], n, d, 1.0f, ws.x.data(),
                         nullptr);
        cpu::gather_rows(&v.at(b, h, next, 0), v.strides[2], v.strides[3], n, dv, 1.0f, ws.v.data(),
                         nullptr);
        next += n;
      } else {
        for (; n < rows && next < T; ++next) {
          if (!key_mask->at(b, next)) continue;
          cpu::gather_rows(&k.at(b, h, next, 0), 0, k.strides[3], 1, d, 1.0f, ws.x.data() + n * d,
                           nullptr);
          cpu::gather_rows(&v.at(b, h, next, 0), 0, v.strides[3], 1, dv, 1.0f, ws.v.data() + n * dv,
                           nullptr);
          ++n;
        }
        if (n == 0) break;
      }
      float* p = ws.scores.data();
      cpu::assign_rows(ws.x.data(), n, table, tau, ws.z.data(), p);
      if (!soft) {  // one row add per token: O(Dv)
        for (int64_t r = 0; r < n; ++r) {
          float* row = sums + ws.z[r] * dv;
          const float* value = ws.v.data() + r * dv;
          for (int64_t x = 0; x < dv; ++x) row[x] += value[x];
          // Exact while a code holds fewer than 2^24 tokens.
          counts[ws.z[r]] += 1.0f;
        }
        continue;
      }
      if (n == 1) {  // a decode step: the vectorised rank-1 update, no BLAS call overhead
        cpu::rank1_update(sums, p, ws.v.data(), c, dv);
      } else {  // sums += P^T V
        cpu::gemm(true, false, c, dv, n, 1.0f, p, c, ws.v.data(), dv, 1.0f, sums, dv);
      }
      for (int64_t r = 0; r < n; ++r)
        for (int64_t s = 0; s < c; ++s) counts[s] += p[r * c + s];
    }
    return int64_t{0};
  });
  position_ += T;
}

void VQDecoder::query(TensorView q, MutableTensorView out) const {
  detail::check_step(q, batch_, heads_, d_, "q", "D");
  detail::check_output(out, {batch_, heads_, q.shape[2], dv_}, "out", {q});
  const int64_t T = q.shape[2], c = codes_, d = d_, dv = dv_, heads = batch_ * heads_;
  const int64_t rows = std::min(T, cpu::kRowTile);
  const float scale = static_cast<float>(scale_);
  const int threads = cpu::threads_for(heads, double(T) * 2.0 * c * (d + dv), num_threads());
  std::vector<QuerySpace> spaces = cpu::make_workspaces<QuerySpace>(threads, rows, d, dv, c);
  cpu::for_each_head(cpu::heads_only(heads, threads), spaces, [&](int64_t bh, QuerySpace& ws) {
    const int64_t b = bh / heads_, h = bh % heads_, g = cb_heads_ == 1 ? 0 : h;
    const float* codebook = codebook_.data() + g * c * d;
    const float* sums = sums_.data() + bh * c * dv;
    const float* counts = counts_.data() + bh * c;
    // Codes with no token (or a soft count below FLT_MIN) get log n_s = -inf: weight 0.
    cpu::log_or_neg_inf(counts, ws.log_counts.data(), c);
    for (int64_t t0 = 0; t0 < T; t0 += rows) {
      const int64_t n = std::min(rows, T - t0);
      cpu::gather_rows(&q.at(b, h, t0, 0), q.strides[2], q.strides[3], n, d, 1.0f, ws.x.data(),
                       nullptr);
      cpu::gemm(false, true, n, c, d, scale, ws.x.data(), d, codebook, d, 0.0f, ws.logits.data(),
                c);
      for (int64_t r = 0; r < n; ++r) {
        const float* logits = ws.logits.data() + r * c;
        // m = max_s (l_s + log n_s), the largest summand of the denominator: after the shift
        // the denominator sum_s e^(l_s - m) n_s lies in [1, c], and e^(l_s - m) <= 1 / n_s
        // <= 1 / FLT_MIN stays finite. -inf: no token yet, the row is zeros.
        const float m = cpu::max_of_signed_sum(logits, 1.0f, ws.log_counts.data(), c);
        float inv_den = 0.0f;
        if (std::isinf(m)) {
          std::fill(ws.y.begin(), ws.y.end(), 0.0f);
        } else {
          cpu::exp_shift_live(logits, 1.0f, m, ws.log_counts.data(), ws.e.data(), c);
          cpu::transposed_matvec(sums, ws.e.data(), c, dv, ws.y.data());
          inv_den = 1.0f / cpu::dot(ws.e.data(), counts, c);
        }
        for (int64_t x = 0; x < dv; ++x) out.at(b, h, t0 + r, x) = ws.y[x] * inv_den;
      }
    }
    return int64_t{0};
  });
}

Tensor VQDecoder::query(TensorView q) const {
  detail::check_step(q, batch_, heads_, d_, "q", "D");
  Tensor out({batch_, heads_, q.shape[2], dv_});
  query(q, out.mutable_view());
  return out;
}

}  // namespace favor
