// The CPU entry of the kernel seam (kernels/backend.hpp): each kernel with the configuration
// of favor's runtime, read at every call (set_num_threads takes effect at once).
#include "kernels/backend.hpp"

#include "cpu/attention_params.hpp"
#include "cpu/backend_info.hpp"
#include "cpu/bf16_gemm.hpp"
#include "cpu/blas.hpp"
#include "cpu/codebook_ops.hpp"
#include "cpu/config.hpp"
#include "cpu/decoder_step.hpp"
#include "cpu/band_attention.hpp"
#include "cpu/hybrid_causal.hpp"
#include "cpu/exact_attention.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/isa_cap.hpp"
#include "cpu/kernel_moments.hpp"
#include "cpu/vq_assign.hpp"
#include "cpu/vq_decoder_step.hpp"
#include "cpu/vq_params.hpp"

namespace favor::cpu {
namespace {

class CpuCausalSplit final : public kernels::CausalBackwardSplit {
 public:
  CpuCausalSplit(int64_t heads, int64_t n, int64_t features, int64_t dv) {
    store_.reserve(heads, n, features, dv);
  }
  void phase_a(const BackwardParams& p) override {
    favor_backward_causal_phase_a(p, runtime_config(), store_);
  }
  const std::vector<float>& r() const override { return store_.r; }
  const std::vector<double>& r_max() const override { return store_.r_max; }
  void phase_b(const BackwardParams& p, const float* suffix_r, const double* suffix_ref) override {
    favor_backward_causal_phase_b(p, runtime_config(), store_, suffix_r, suffix_ref);
  }

 private:
  CausalBackwardStore store_;
};

class CpuBackend final : public kernels::Backend {
 public:
  CpuBackend() { check_isa_cap(); }  // a bad FAVOR_CPU stops the first call
  kernels::Tuning tuning() const override { return cpu::tuning(); }
  std::string describe() const override { return cpu::describe(); }
  bool has_bf16() const override { return bf16_supported(); }
  int64_t favor_bidirectional(const AttentionParams& p) override {
    return p.bf16 ? favor_bidirectional_bf16(p, runtime_config())
                  : cpu::favor_bidirectional(p, runtime_config());
  }
  int64_t favor_causal(const AttentionParams& p) override {
    return cpu::favor_causal(p, runtime_config());
  }
  void favor_backward_bidirectional(const BackwardParams& p) override {
    cpu::favor_backward_bidirectional(p, runtime_config());
  }
  void favor_backward_causal(const BackwardParams& p) override {
    cpu::favor_backward_causal(p, runtime_config());
  }
  kernels::FeatureOverflow features(const kernels::FeaturesParams& p) override {
    return exact_features(p);
  }
  void kernel_moments(const MomentsParams& p) override { cpu::kernel_moments(p, runtime_config()); }
  void dgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
             const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
             int64_t ldc) override {
    gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void favor_key_states(const AttentionParams& p, float* states, double* maxima,
                        float* distance) override {
    key_states(p, runtime_config(), states, maxima, distance);
  }
  std::unique_ptr<kernels::CausalBackwardSplit> favor_backward_causal_split(int64_t heads,
                                                                            int64_t n,
                                                                            int64_t features,
                                                                            int64_t dv) override {
    return std::make_unique<CpuCausalSplit>(heads, n, features, dv);
  }
  int64_t exact_attention(const AttentionParams& p, bool causal, bool in_double) override {
    return in_double ? exact_attention_f64(p, causal, runtime_config())
                     : exact_attention_f32(p, causal, runtime_config());
  }
  void exact_attention_backward(const BackwardParams& p, bool causal) override {
    cpu::exact_attention_backward(p, causal, runtime_config());
  }
  int64_t band_attention(const kernels::BandParams& p) override {
    return cpu::band_forward(p, runtime_config());
  }
  void band_decode(const kernels::BandDecodeParams& p) override { cpu::band_decode(p); }
  int64_t hybrid_causal(const kernels::HybridCausalParams& p) override {
    return cpu::hybrid_causal(p, runtime_config());
  }
  void band_attention_backward(const kernels::BandBackwardParams& p) override {
    cpu::band_backward(p, runtime_config());
  }
  int64_t vq_bidirectional(const VQParams& p) override {
    return cpu::vq_bidirectional(p, runtime_config());
  }
  int64_t vq_causal(const VQParams& p) override { return cpu::vq_causal(p, runtime_config()); }
  void vq_backward_bidirectional(const VQBackwardParams& p) override {
    cpu::vq_backward_bidirectional(p, runtime_config());
  }
  void vq_backward_causal(const VQBackwardParams& p) override {
    cpu::vq_backward_causal(p, runtime_config());
  }
  void vq_key_states(const VQParams& p, float* states) override {
    cpu::vq_key_states(p, runtime_config(), states);
  }
  int64_t vq_code_sums_size(const VQParams& p) override { return cpu::vq_code_sums_size(p); }
  void vq_backward_keys(const VQBackwardParams& p, const float* sums) override {
    cpu::vq_backward_keys(p, runtime_config(), sums);
  }
  void vq_assign(const VQAssignParams& p) override { vq_assign_keys(p, runtime_config()); }
  void decoder_append(const DecoderAppend& p) override { cpu::decoder_append(p, runtime_config()); }
  void decoder_query(const DecoderQuery& p) override { cpu::decoder_query(p, runtime_config()); }
  void decoder_step(const DecoderStep& p) override { cpu::decoder_step(p, runtime_config()); }
  std::unique_ptr<kernels::KMeansRun> kmeans(const kernels::CodebookKeys& keys,
                                             int64_t codes) override {
    return kmeans_run(keys, codes, runtime_config());
  }
  int64_t codebook_ema(const kernels::CodebookKeys& keys, const kernels::CodebookEMA& p) override {
    return ema_step(keys, p, runtime_config());
  }
  double codebook_distance_sum(const kernels::CodebookQuantise& p) override {
    return distance_sum(p, runtime_config());
  }
  double codebook_commitment(const kernels::CodebookQuantise& p, float grad, float* dk) override {
    return commitment_sum(p, grad, dk, runtime_config());
  }
  std::shared_ptr<const kernels::PreparedCodebook> vq_prepare_codebook(const float* codebook,
                                                                       int64_t sets, int64_t codes,
                                                                       int64_t d) override {
    return prepare_codebook(codebook, sets, codes, d);
  }
  void vq_decoder_append(const VQDecoderAppend& p) override {
    cpu::vq_decoder_append(p, runtime_config());
  }
  void vq_decoder_query(const VQDecoderQuery& p) override {
    cpu::vq_decoder_query(p, runtime_config());
  }
  void vq_decoder_step(const VQDecoderStep& p) override {
    cpu::vq_decoder_step(p, runtime_config());
  }
};

}  // namespace
}  // namespace favor::cpu

namespace favor::kernels {

Backend& backend() {
  static cpu::CpuBackend cpu_backend;
  return cpu_backend;
}

}  // namespace favor::kernels
