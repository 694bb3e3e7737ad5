#pragma once
// Pieces shared by the Transformer-VQ attention kernels (vq_bidirectional.cpp, vq_causal.cpp):
// the workspace, gathering a head's rows, assigning keys to codes, the per-code state
// [Vsum | n] = Delta^T [V | 1] and the stabilised code weights of a query row.
//
// Stabiliser (docs/vq.md): row i's denominator is sum_s exp(L_is) N_is, N_is the (soft)
// count of code s over the keys row i sees. The shift m_i = max_s (L_is + log N_is) is the
// log of its largest summand, so after the shift the denominator lies in [1, c]: no
// overflow and no underflow whatever the size of the logits. Codes with N_is = 0 get weight
// 0 (their exp could overflow and contributes nothing).
#include <cstdint>
#include <vector>

#include "cpu/schedule.hpp"
#include "cpu/vq_assign.hpp"
#include "cpu/vq_params.hpp"

namespace favor::cpu {

struct VQWorkspace {
  int64_t codes, dv, rows;          // rows: tile (bidirectional) or block (causal) capacity
  std::vector<float> x;             // rows x d: gathered keys or queries
  std::vector<float> sv;            // (codes + rows) x (dv + 1): [Vsum | n], then a block's [V | 1]
  std::vector<float> xg;            // rows x (codes + rows): logits, then weights [X | G]
  std::vector<float> p;             // rows x codes: distance scratch (hard) or p(s|k) (soft)
  std::vector<float> count, log_n;  // codes: running counts N_s and their logs
  std::vector<float> yx;            // rows x (dv + 1): [num | den]
  std::vector<int32_t> z;           // rows: nearest codes (hard)
  std::vector<char> visible;        // rows: key mask flags of a block
  VQWorkspace(int64_t d, int64_t codes_, int64_t dv_, int64_t rows_);
  float* state() { return sv.data(); }
  int64_t ld() const { return dv + 1; }
  int64_t ldg() const { return codes + rows; }
};

/// Whether key j of batch b takes part.
inline bool key_visible(const AttentionParams& p, int64_t b, int64_t j) {
  return p.mask == nullptr || p.mask[b * p.mask_stride_b + j * p.mask_stride_n] != 0;
}

/// dst (rows x width) = rows [start, start + rows) of head (b, h) of a [B, H, N, width] view.
void gather_head_rows(const float* base, const Shape4& st, int64_t b, int64_t h, int64_t start,
                      int64_t rows, int64_t width, float* dst);

/// Gathers the next keys of head (b, h) that take part, from *next up to end and at most
/// ws.rows of them: key rows into ws.x, [v | 1] into vx. Advances *next; returns the count.
int64_t gather_visible_keys(const VQParams& p, int64_t b, int64_t h, int64_t* next, int64_t end,
                            float* vx, VQWorkspace& ws);

/// Gathers keys [j0, j0 + rows) of head (b, h), masked ones included: key rows into ws.x,
/// mask flags into ws.visible, [v | 1] into vx with masked rows all zero (so that they add
/// nothing to a numerator or denominator).
void gather_key_block(const VQParams& p, int64_t b, int64_t h, int64_t j0, int64_t rows, float* vx,
                      VQWorkspace& ws);

/// Gathers `rows` query rows of head (b, h) from row i0 into ws.x and writes their logits
/// scale * Q C^T into ws.xg (leading dimension ldl).
void query_logits(const VQParams& p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                  const float* codebook, int64_t ldl, VQWorkspace& ws);

/// Assigns the `rows` keys in ws.x: hard, nearest codes into ws.z; soft, p(s|k) into ws.p
/// (rows x c). Rows whose flag in `visible` is 0 (if not null) get p = 0.
void assign_keys(const VQParams& p, const CodeTable& table, int64_t rows, const char* visible,
                 VQWorkspace& ws);

/// [Vsum | n] += Delta^T vx for `rows` assigned keys with augmented values vx (rows x (dv+1));
/// hard: row by row into the code's row (skipping invisible rows); soft: one GEMM P^T vx.
void add_to_state(const VQParams& p, int64_t rows, const float* vx, const char* visible,
                  VQWorkspace& ws);

/// Weights of one query row: x[s] = exp(L[s] - m) where log_n[s] > -inf, else 0, with
/// m = max_s (L[s] + log_n[s]). In place (x may be L). Returns m (-inf: no live code).
float code_weights(const float* L, const float* log_n, int64_t codes, float* x);

/// The forward kernels' driver: run_head(b, h, codebook, table, ws) for every (batch, head),
/// one task per head (heads_only, up to `threads`), workspaces of `rows` rows; returns the sum of
/// run_head's results (rows written as zeros).
template <class RunHead>
int64_t vq_forward_over_heads(const VQParams& p, int threads, int64_t rows, RunHead run_head) {
  const AttentionParams& a = p.base;
  const std::vector<CodeTable> tables = all_code_tables(p);
  const Schedule plan = heads_only(a.batch * a.heads, threads);
  std::vector<VQWorkspace> spaces =
      make_workspaces<VQWorkspace>(plan.team, a.d, p.codes, a.dv, rows);
  return for_each_head(plan, spaces, [&](int64_t bh, VQWorkspace& ws) {
    const int64_t h = bh % a.heads, g = p.codebook_head_stride == 0 ? 0 : h;
    return run_head(bh / a.heads, h, p.head_codebook(bh), tables[g], ws);
  });
}

}  // namespace favor::cpu
