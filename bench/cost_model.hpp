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
/// products, about 2 N C (F + dv) for chunk length C. Bidirectional attention on short
/// sequences (N <= 256, the row tile) takes the short path where it costs less
/// (src/cpu/favor_short.cpp): (phi(Q) phi(K)^T) [V | 1], 2 N^2 (F + dv + 1) after the
/// feature maps.
inline double favor_flops(const Problem& p, bool causal, int64_t chunk) {
  const double n = double(p.n), maps = 4.0 * n * p.d * p.m,
               state = 2.0 * n * p.f * p.dv + 2.0 * n * p.f * (p.dv + 1),
               quadratic = 2.0 * n * n * double(p.f + p.dv + 1);
  if (causal) return double(p.bh) * (maps + state + 2.0 * n * double(chunk) * double(p.f + p.dv));
  const bool short_path = p.n <= 256 && n * n * double(p.f + p.dv + 1) <
                                            2.0 * n * double(p.f) * double(p.dv + 1);
  return double(p.bh) * (maps + (short_path ? quadratic : state));
}

/// FAVOR backward as implemented (src/cpu/favor_backward*.cpp): bidirectional recomputes
/// the key projection twice and the query projection once (3 x 2 N d m), chains two
/// feature gradients (2 x 2 N d m) and runs six N x F x (dv + 1) products; causal
/// recomputes both projections in each of its two sweeps and adds the intra-chunk terms.
/// dW (optional) adds 2 x 2 N d m and is not counted.
inline double favor_backward_flops(const Problem& p, bool causal, int64_t chunk) {
  const double n = double(p.n), dm = double(p.d) * double(p.m), fv = double(p.f) * double(p.dv + 1);
  const double per_head =
      causal ? n * (12.0 * dm + 10.0 * fv + 2.0 * double(chunk) * (4.0 * p.f + 3.0 * (p.dv + 1)))
             : n * (10.0 * dm + 12.0 * fv);
  return double(p.bh) * per_head;
}

/// The bidirectional backward given the forward's saved key state: no key pass to redo.
inline double favor_backward_flops_with_context(const Problem& p) {
  const double n = double(p.n), dm = double(p.d) * double(p.m), fv = double(p.f) * double(p.dv + 1);
  return double(p.bh) * n * (8.0 * dm + 10.0 * fv);
}

/// The causal backward given the forward's saved chunk states and rows
/// (AttentionOptions::save_causal_states): one sweep, each projection once (2 x 2 N d m),
/// two feature gradients (2 x 2 N d m), four N x F x (dv + 1) products (dphi(Q), dphi(K),
/// dV, R) and, per chunk, G, D phi(K), D^T phi(Q) (3 x 2 N C F) and D, G^T gx (2 x 2 N C
/// (dv + 1)).
inline double favor_causal_backward_flops_with_context(const Problem& p, int64_t chunk) {
  const double n = double(p.n), dm = double(p.d) * double(p.m), fv = double(p.f) * double(p.dv + 1);
  return double(p.bh) * n *
         (8.0 * dm + 8.0 * fv + 2.0 * double(chunk) * (3.0 * p.f + 2.0 * (p.dv + 1)));
}

/// Exact backward as implemented (src/cpu/exact_backward.cpp): the forward with the row
/// log-sum-exp (4 N^2 d), then Q K^T, dy V^T and dS K for dq, then Q K^T, dy V^T, P^T dy and
/// dS^T Q for dk and dv: 18 N^2 d for d = dv, half of it when causal.
inline double exact_backward_flops(const Problem& p, bool causal) {
  const double full = 9.0 * double(p.n) * double(p.n) * double(p.d + p.dv);
  return double(p.bh) * (causal ? full / 2 : full);
}

/// Exact softmax attention: Q K^T and P V, 4 N^2 d (d = dv here), half of it when causal.
inline double exact_flops(const Problem& p, bool causal) {
  const double full = 2.0 * double(p.n) * double(p.n) * double(p.d + p.dv);
  return double(p.bh) * (causal ? full / 2 : full);
}

/// Hard Transformer-VQ forward with c codes (src/cpu/vq_bidirectional.cpp, vq_causal.cpp):
/// key assignment through |C|^2 - 2 k.C (2 N c d), logits scale Q C^T (2 N c d), outputs
/// exp(L) [Vsum | n] (2 N c (dv + 1)) and the per-code sums (N (dv + 1) additions). Causal,
/// in blocks of L: the intra-block weights G times [V_blk | 1] add 2 N L (dv + 1).
inline double vq_flops(const Problem& p, int64_t codes, bool causal, int64_t block) {
  const double n = double(p.n), c = double(codes), dv1 = double(p.dv + 1);
  const double per_head = 4.0 * n * c * double(p.d) + 2.0 * n * c * dv1 + n * dv1 +
                          (causal ? 2.0 * n * double(block) * dv1 : 0.0);
  return double(p.bh) * per_head;
}

/// Hard Transformer-VQ backward (src/cpu/vq_backward*.cpp), the main GEMMs per head: key
/// assignment 2 N c d; per query the logits 2 c d, [num | den] 2 c (dv + 1), dy Vsum^T 2 c dv,
/// dq 2 c d, the query part of dC 2 c d, U = W^T dY 2 c dv and w 2 c d; the straight-through
/// key gradient by the cheaper route of each code (src/cpu/vq_key_routes.hpp), assuming
/// balanced codes n_s = N / c: direct when n_s (d + dv) < d dv, dY V^T and M'^T Q over every
/// (query, key) pair, 2 N^2 (d + dv) (causal: the pairs across blocks, about half), else the
/// per-code moments T = W^T vec(q dy^T), 2 N c d dv, and T_z v per key 2 N d dv. Causal adds
/// the intra-block products (weights, dy V^T, A^T dy, (A o D)^T Q: 2 N L (d + 2 dv + c)).
/// Codebook gradient on.
inline double vq_backward_flops(const Problem& p, int64_t codes, bool causal, int64_t block) {
  const double n = double(p.n), c = double(codes), d = double(p.d), dv = double(p.dv);
  const bool direct = (n / c) * (d + dv) < d * dv;
  const double key_grad =
      direct ? (causal ? 1.0 : 2.0) * n * n * (d + dv) : 2.0 * n * c * d * dv + 2.0 * n * d * dv;
  const double per_head = 2.0 * n * c * (5.0 * d + 3.0 * dv + 1.0) + key_grad +
                          (causal ? 2.0 * n * double(block) * (d + 2.0 * dv + c) : 0.0);
  return double(p.bh) * per_head;
}

/// One decode step (append one token and query one) per head: projections of k and q
/// 2 x 2 d m, the state update F dv + F (as multiply-adds: 2 F (dv + 1)), the query
/// 2 F (dv + 1).
inline double decode_step_flops(const Problem& p) {
  return double(p.bh) * (4.0 * p.d * p.m + 4.0 * p.f * (p.dv + 1));
}

/// One VQ decode step per head with c codes: the key's assignment 2 c d, its add Dv (hard)
/// or 2 c Dv (soft), the query's logits 2 c d and S^T e with the counts 2 c (dv + 1).
inline double vq_decode_step_flops(const Problem& p, int64_t codes, bool soft) {
  const double c = double(codes);
  return double(p.bh) *
         (4.0 * c * p.d + (soft ? 2.0 * c * p.dv : double(p.dv)) + 2.0 * c * (p.dv + 1));
}

/// C = A B for n x n matrices.
inline double sgemm_flops(int64_t n) {
  return 2.0 * double(n) * double(n) * double(n);
}

}  // namespace favor::bench
