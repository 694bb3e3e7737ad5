// Causal Transformer-VQ attention in blocks of L = p.block tokens, per (batch, head):
//   [num | den]_blk = [X | G] [[Vsum | n]_{<blk} ; [V_blk | 1]]     (one GEMM)
//   [Vsum | n]_{<blk+1} = [Vsum | n]_{<blk} + Delta_blk^T [V_blk | 1]
// X_is = exp(L_is - m_i) are the weights of the codes (L = scale Q C^T, one GEMM), G the
// intra-block causal matrix (j <= i, visible): hard G_ij = X_{i,z_j} (a gather), soft
// G = X P_blk^T (a GEMM) with the upper triangle zeroed. The per-code sums of earlier blocks
// are plain sums: a key's contribution is v_j or p(s|k_j), never an exponential.
//
// Row i's denominator is sum_s exp(L_is) N_is with N_is = n_s + the (soft) count of code s
// over the block's visible keys j <= i: the running counts are kept row by row, so the
// stabiliser m_i = max_s (L_is + log N_is) is the log of the row's largest summand (hard:
// one log per key; soft: a vectorised log of the c counts per row). The result depends on
// L only through float rounding. Sequence parallel: the sums start from init_states (the
// earlier ranks' keys), counts included. Memory O(threads * L * (c + L + d + dv)).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/head_state.hpp"
#include "cpu/schedule.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/vq_assign.hpp"
#include "cpu/vq_params.hpp"
#include "cpu/vq_state.hpp"

namespace favor::cpu {
namespace {

// Weights [X | G] of the block's `rows` query rows from their logits in ws.xg, advancing the
// running counts (ws.count, ws.log_n) over the block's keys.
void block_weights(const VQParams& p, int64_t rows, VQWorkspace& ws) {
  const int64_t c = p.codes, ldg = ws.ldg();
  float* count = ws.count.data();
  float* log_n = ws.log_n.data();
  for (int64_t i = 0; i < rows; ++i) {
    float* x = ws.xg.data() + i * ldg;
    if (ws.visible[i]) {  // key i joins the counts row i sees
      if (p.tau == 0.0f) {
        const int32_t s = ws.z[i];
        count[s] += 1.0f;
        log_n[s] = std::log(count[s]);
      } else {
        const float* pi = ws.p.data() + i * c;
        for (int64_t s = 0; s < c; ++s) count[s] += pi[s];
        log_or_neg_inf(count, log_n, c);
      }
    }
    code_weights(x, log_n, c, x);
    if (p.tau == 0.0f) {
      float* g = x + c;
      for (int64_t j = 0; j <= i; ++j) g[j] = ws.visible[j] ? x[ws.z[j]] : 0.0f;
      std::fill(g + i + 1, g + rows, 0.0f);
    }
  }
  if (p.tau == 0.0f) return;
  // G = X P^T. Above the diagonal X_i may be large where row i's counts are tiny (and
  // products may overflow): those entries are discarded.
  float* g = ws.xg.data() + c;
  gemm(false, true, rows, rows, c, 1.0f, ws.xg.data(), ldg, ws.p.data(), c, 0.0f, g, ldg);
  for (int64_t i = 0; i + 1 < rows; ++i) std::fill(g + i * ldg + i + 1, g + i * ldg + rows, 0.0f);
}

int64_t head(const VQParams& p, int64_t b, int64_t h, const float* codebook, const CodeTable& table,
             VQWorkspace& ws) {
  const AttentionParams& a = p.base;
  const int64_t c = p.codes, ld = ws.ld(), ldg = ws.ldg();
  float* state = ws.state();
  float* vx = state + c * ld;  // the block's [V | 1], right below the state
  if (p.init_states) {         // the earlier ranks' keys
    const float* given = p.init_states + (b * a.heads + h) * c * ld;
    std::copy(given, given + c * ld, state);
  } else {
    std::fill(state, state + c * ld, 0.0f);
  }
  for (int64_t s = 0; s < c; ++s) ws.count[s] = state[s * ld + a.dv];
  log_or_neg_inf(ws.count.data(), ws.log_n.data(), c);
  float* oh = a.out + b * a.out_strides[0] + h * a.out_strides[1];
  int64_t zero_rows = 0;
  for (int64_t t0 = 0; t0 < a.nq; t0 += ws.rows) {
    const int64_t rows = std::min(ws.rows, a.nq - t0);
    gather_key_block(p, b, h, t0, rows, vx, ws);
    assign_keys(p, table, rows, ws.visible.data(), ws);
    query_logits(p, b, h, t0, rows, codebook, ldg, ws);
    block_weights(p, rows, ws);
    gemm(false, false, rows, ld, c + rows, 1.0f, ws.xg.data(), ldg, state, ld, 0.0f, ws.yx.data(),
         ld);
    zero_rows += write_rows(ws.yx.data(), rows, a.dv, oh + t0 * a.out_strides[2], a.out_strides[2],
                            a.out_strides[3]);
    add_to_state(p, rows, vx, ws.visible.data(), ws);
    // The counts restart from the state's exact sums: the soft running counts were summed
    // in another order than the state's GEMM.
    for (int64_t s = 0; s < c; ++s) ws.count[s] = state[s * ld + a.dv];
    log_or_neg_inf(ws.count.data(), ws.log_n.data(), c);
  }
  if (p.final_states)  // the decoder's prefill keeps the state
    std::copy(state, state + c * ld, p.final_states + (b * a.heads + h) * c * ld);
  return zero_rows;
}

}  // namespace

int64_t vq_causal(const VQParams& p, const Config& config) {
  return vq_forward_over_heads(
      p, config.threads, std::min(p.block, p.base.nq),
      [&](int64_t b, int64_t h, const float* codebook, const CodeTable& table, VQWorkspace& ws) {
        return head(p, b, h, codebook, table, ws);
      });
}

}  // namespace favor::cpu
