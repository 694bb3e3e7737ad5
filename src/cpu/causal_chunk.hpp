#pragma once
// Pieces of one causal chunk shared by the forward sweep (favor_causal.cpp) and the
// backward sweeps (favor_backward_causal.cpp): the chunk workspace, key features against
// the per-token running max, and query features shifted by each row's exact prefix
// normaliser (docs/numerics.md).
#include <cstdint>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/head_state.hpp"
#include "cpu/key_state.hpp"
#include "cpu/tiles.hpp"

namespace favor::cpu {

struct ChunkWorkspace {
  int64_t F, dv;
  int64_t bh = 0, c0 = 0;  // the loaded chunk: head and first position (load_chunk)
  // The projected block (load_block): positions [block_begin, block_end) of head block_bh.
  int64_t block_bh = -1, block_begin = 0, block_end = 0;
  std::vector<float> x;  // 2B x d (B = kProjectBlock): the block's keys, then its queries
  std::vector<float> a;  // 2B x m: their projections
  std::vector<double> block_half_norm2;  // B: the keys' |x|^2 / 2
  std::vector<float> wt;                 // d x m: W^T of head wt_bh (load_block)
  int64_t wt_bh = -1;
  // The loaded chunk's rows in the block (load_chunk): keys and queries (x), projections (a),
  // the keys' |x|^2 / 2.
  const float *xk = nullptr, *xq = nullptr, *ak = nullptr, *aq = nullptr;
  const double* half_norm2 = nullptr;
  std::vector<float> phik;    // C x F
  std::vector<float> qg;      // C x (F + C): [phi(Q_c) | G]
  std::vector<float> prefix;  // C x F: prefix normalisers P_r (positive family)
  std::vector<float> sv;      // (F + C) x (dv + 1): [S | s] of the state, then [V_c | 1]
  std::vector<float> yx;      // C x (dv + 1)
  std::vector<float> s;       // F: the state's normaliser column
  std::vector<float> local;   // F x (dv + 1): a segment's local key state
  std::vector<double> g, run_max;
  std::vector<double> qshift;  // C: each query row's shift c_i (+inf: no visible key yet)
  std::vector<char> visible;
  KeyTile tile;
  ChunkWorkspace(int64_t d, int64_t m, int64_t F_, int64_t dv_);
  HeadState state() { return HeadState{sv.data(), F, dv}; }
  /// Forgets the loaded block: a new sweep's inputs may differ from the last one's.
  void forget_block() {
    block_bh = -1;
    wt_bh = -1;
  }
  int64_t ldq() const { return F + kChunk; }
};

/// exp(from - to) for running maxima from <= to; 1 when equal (also both -inf).
float rescale(double from, double to);

/// Gathers positions [begin, end) of head (b, h), at most kProjectBlock of them: key and
/// query rows (scaled) into x, and projects them all with one GEMM into a. The sweeps load
/// the block of the next few chunks when a chunk is not in the loaded one.
void load_block(const AttentionParams& p, int64_t b, int64_t h, int64_t begin, int64_t end,
                ChunkWorkspace& ws);

/// Whether chunk rows [c0, c0 + rows) of head bh are in the loaded block.
bool block_holds(const ChunkWorkspace& ws, int64_t bh, int64_t c0, int64_t rows);

/// Makes chunk rows [c0, c0 + rows) of head (b, h), which must be in the loaded block
/// (block_holds), the current chunk: its rows of the block (xk, xq, ak, aq, half_norm2),
/// [V | 1] into vx, mask flags into visible.
void load_chunk(const AttentionParams& p, int64_t b, int64_t h, int64_t c0, int64_t rows, float* vx,
                ChunkWorkspace& ws);

/// Key features of the chunk, each relative to its running max run_max[r], starting from
/// the state's max `prev_max` (zeros for masked keys). True if the max moved in the chunk.
bool chunk_key_features(const AttentionParams& p, int64_t rows, double prev_max,
                        ChunkWorkspace& ws);

/// Query features of the chunk into the left block of qg, each row shifted by
/// max_f (L_f + log P_f), P_i = P_{i-1} exp(M_{i-1} - M_i) + phi(k_i), P_{-1} = s_prev (the
/// state's normaliser, relative to prev_max). Leaves P in ws.prefix.
void chunk_query_features(const AttentionParams& p, int64_t rows, const float* s_prev,
                          double prev_max, ChunkWorkspace& ws);

/// G = phi(Q_c) phi(K_c)^T into the right block of qg: lower triangle (j <= i), each term
/// at scale exp(M_j - M_i).
void chunk_kernel_matrix(int64_t rows, bool moved, ChunkWorkspace& ws);

/// [num | den] of the chunk into ws.yx: [phi(Q_c) | G] [S | s ; V_c | 1] in one GEMM, the
/// state read by row i at scale exp(M_{<c} - M_i) (phi(Q_c) rows are scaled in place).
/// empty_state: no key before the chunk ([S | s] = 0, which need not be stored): only
/// G [V_c | 1].
void chunk_output(int64_t rows, double state_max, bool moved, ChunkWorkspace& ws,
                  bool empty_state = false);

/// Adds the chunk's keys to the state, relative to the chunk's last running max.
void chunk_state_update(int64_t rows, bool moved, HeadState& state, const float* vx,
                        ChunkWorkspace& ws);

}  // namespace favor::cpu
