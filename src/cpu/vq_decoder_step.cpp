// The streaming Transformer-VQ decoder's steps on the CPU (kernels/vq_decoder_params.hpp,
// math.md s.6). append assigns each token (cpu/vq_assign.hpp) and adds it to its code's sums
// and count: O(c D) for the assignment plus O(Dv) (hard) or O(c Dv) (soft); query costs a
// GEMM row of logits against the codes, then S^T e and a dot with the counts: O(c (D + Dv))
// per token and head whatever the position, heads spread over threads. Tiles of kRowTile
// rows bound the scratch (rows x c) of a long prefill or query.
#include "cpu/vq_decoder_step.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/schedule.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
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

std::shared_ptr<const kernels::PreparedCodebook> prepare_codebook(const float* codebook,
                                                                  int64_t sets, int64_t codes,
                                                                  int64_t d) {
  auto prepared = std::make_shared<PreparedCodes>();
  for (int64_t g = 0; g < sets; ++g)
    prepared->tables.push_back(code_table(codebook + g * codes * d, codes, d));
  return prepared;
}

void vq_decoder_append(const VQDecoderAppend& da, const Config& config) {
  const AttentionParams& p = da.step.base;
  const int64_t T = p.nk, c = da.step.codes, d = p.d, dv = p.dv, heads = p.batch * p.heads;
  const bool soft = da.step.tau > 0.0f;
  const float tau = da.step.tau;
  const auto& tables = static_cast<const PreparedCodes*>(da.prepared)->tables;
  const int64_t rows = std::min(T, kRowTile);
  const double work = double(T) * (2.0 * c * d + (soft ? 2.0 * c * dv : double(dv)));
  const int threads = threads_for(heads, work, config.threads);
  std::vector<AppendSpace> spaces = make_workspaces<AppendSpace>(threads, rows, d, dv, c);
  for_each_head(
      heads_only(heads, threads, double(heads) * work), spaces, [&](int64_t bh, AppendSpace& ws) {
        const int64_t b = bh / p.heads, h = bh % p.heads;
        const CodeTable& table = tables[da.step.codebook_head_stride == 0 ? 0 : h];
        const float* kh = p.k + b * p.k_strides[0] + h * p.k_strides[1];
        const float* vh = p.v + b * p.v_strides[0] + h * p.v_strides[1];
        float* sums = da.sums + bh * c * dv;
        float* counts = da.counts + bh * c;
        // The tokens that take part, in tiles: a masked token is skipped, so a masked append
        // equals an append of the kept tokens alone (same tiles).
        int64_t next = 0;
        while (next < T) {
          int64_t n = 0;
          if (!p.mask) {
            n = std::min(rows, T - next);
            gather_rows(kh + next * p.k_strides[2], p.k_strides[2], p.k_strides[3], n, d, 1.0f,
                        ws.x.data(), nullptr);
            gather_rows(vh + next * p.v_strides[2], p.v_strides[2], p.v_strides[3], n, dv, 1.0f,
                        ws.v.data(), nullptr);
            next += n;
          } else {
            for (; n < rows && next < T; ++next) {
              if (!p.mask[b * p.mask_stride_b + next * p.mask_stride_n]) continue;
              gather_rows(kh + next * p.k_strides[2], 0, p.k_strides[3], 1, d, 1.0f,
                          ws.x.data() + n * d, nullptr);
              gather_rows(vh + next * p.v_strides[2], 0, p.v_strides[3], 1, dv, 1.0f,
                          ws.v.data() + n * dv, nullptr);
              ++n;
            }
            if (n == 0) break;
          }
          float* pk = ws.scores.data();
          assign_rows(ws.x.data(), n, table, tau, ws.z.data(), pk);
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
            rank1_update(sums, pk, ws.v.data(), c, dv);
          } else {  // sums += P^T V
            gemm(true, false, c, dv, n, 1.0f, pk, c, ws.v.data(), dv, 1.0f, sums, dv);
          }
          for (int64_t r = 0; r < n; ++r)
            for (int64_t s = 0; s < c; ++s) counts[s] += pk[r * c + s];
        }
        return int64_t{0};
      });
}

void vq_decoder_query(const VQDecoderQuery& dq, const Config& config) {
  const AttentionParams& p = dq.step.base;
  const int64_t T = p.nq, c = dq.step.codes, d = p.d, dv = p.dv, heads = p.batch * p.heads;
  const int64_t rows = std::min(T, kRowTile);
  const float scale = dq.step.scale;
  const int threads = threads_for(heads, double(T) * 2.0 * c * (d + dv), config.threads);
  std::vector<QuerySpace> spaces = make_workspaces<QuerySpace>(threads, rows, d, dv, c);
  for_each_head(heads_only(heads, threads, double(heads * T) * 2.0 * c * (d + dv)), spaces,
                [&](int64_t bh, QuerySpace& ws) {
                  const int64_t b = bh / p.heads, h = bh % p.heads;
                  const float* codebook = dq.step.head_codebook(bh);
                  const float* qh = p.q + b * p.q_strides[0] + h * p.q_strides[1];
                  float* oh = p.out + b * p.out_strides[0] + h * p.out_strides[1];
                  const float* sums = dq.sums + bh * c * dv;
                  const float* counts = dq.counts + bh * c;
                  // Codes with no token (or a soft count below FLT_MIN) get log n_s = -inf: weight
                  // 0.
                  log_or_neg_inf(counts, ws.log_counts.data(), c);
                  for (int64_t t0 = 0; t0 < T; t0 += rows) {
                    const int64_t n = std::min(rows, T - t0);
                    gather_rows(qh + t0 * p.q_strides[2], p.q_strides[2], p.q_strides[3], n, d,
                                1.0f, ws.x.data(), nullptr);
                    gemm(false, true, n, c, d, scale, ws.x.data(), d, codebook, d, 0.0f,
                         ws.logits.data(), c);
                    for (int64_t r = 0; r < n; ++r) {
                      const float* logits = ws.logits.data() + r * c;
                      // m = max_s (l_s + log n_s), the largest summand of the denominator: after
                      // the shift the denominator sum_s e^(l_s - m) n_s lies in [1, c], and e^(l_s
                      // - m) <= 1 / n_s
                      // <= 1 / FLT_MIN stays finite. -inf: no token yet, the row is zeros.
                      const float m = max_of_signed_sum(logits, 1.0f, ws.log_counts.data(), c);
                      float inv_den = 0.0f;
                      if (std::isinf(m)) {
                        std::fill(ws.y.begin(), ws.y.end(), 0.0f);
                      } else {
                        exp_shift_live(logits, 1.0f, m, ws.log_counts.data(), ws.e.data(), c);
                        transposed_matvec(sums, ws.e.data(), c, dv, ws.y.data());
                        inv_den = 1.0f / dot(ws.e.data(), counts, c);
                      }
                      float* row = oh + (t0 + r) * p.out_strides[2];
                      for (int64_t x = 0; x < dv; ++x)
                        row[x * p.out_strides[3]] = ws.y[x] * inv_den;
                    }
                  }
                  return int64_t{0};
                });
}

}  // namespace favor::cpu
