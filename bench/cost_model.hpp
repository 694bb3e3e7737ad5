#pragma once
// The cost model of algorithms.md, written once: flop counts per call from which `favor
// bench` and the Google Benchmark target report GFLOP/s. Exponentials are not counted.
#include <cstdint>

namespace favor::bench {

struct Problem {
  int64_t bh;  // batch x heads
  int64_t n;   // sequence length (queries = keys)
  int64_t d;   // head dim
  int64_t dv;  // value dim
  int64_t m;   // projections
  int64_t f;   // features: m (positive) or 2m (trig, hyperbolic)
};

/// FAVOR forward: feature maps 2 N d m for Q and again for K; S = phi(K)^T V: 2 N F dv;
/// outputs and normaliser phi(Q) [S s]: 2 N F (dv + 1). Causal adds the intra-chunk
/// products, about 2 N C (F + dv) for chunk length C.
inline double favor_flops(const Problem& p, bool causal, int64_t chunk) {
  const double n = double(p.n),
               per_head = 4.0 * n * p.d * p.m + 2.0 * n * p.f * p.dv + 2.0 * n * p.f * (p.dv + 1);
  const double intra = causal ? 2.0 * n * double(chunk) * double(p.f + p.dv) : 0.0;
  return double(p.bh) * (per_head + intra);
}

/// Exact softmax attention: Q K^T and P V, 4 N^2 d (d = dv here), half of it when causal.
inline double exact_flops(const Problem& p, bool causal) {
  const double full = 2.0 * double(p.n) * double(p.n) * double(p.d + p.dv);
  return double(p.bh) * (causal ? full / 2 : full);
}

/// One decode step (append one token and query one) per head: projections of k and q
/// 2 x 2 d m, the state update F dv + F (as multiply-adds: 2 F (dv + 1)), the query
/// 2 F (dv + 1).
inline double decode_step_flops(const Problem& p) {
  return double(p.bh) * (4.0 * p.d * p.m + 4.0 * p.f * (p.dv + 1));
}

/// C = A B for n x n matrices.
inline double sgemm_flops(int64_t n) {
  return 2.0 * double(n) * double(n) * double(n);
}

}  // namespace favor::bench
