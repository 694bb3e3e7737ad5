#pragma once
// The streaming Transformer-VQ decoder's steps on the CPU: append and query
// (kernels/vq_decoder_params.hpp), and the codebook prepared for assignment.
#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/config.hpp"
#include "cpu/vq_assign.hpp"
#include "kernels/vq_decoder_params.hpp"

namespace favor::cpu {

using kernels::VQDecoderAppend;
using kernels::VQDecoderQuery;
using kernels::VQDecoderStep;

/// The CPU's prepared codebook: one code table per codebook head.
struct PreparedCodes final : kernels::PreparedCodebook {
  std::vector<CodeTable> tables;
};

/// The tables of `sets` codebooks (sets x codes x d, row-major).
std::shared_ptr<const kernels::PreparedCodebook> prepare_codebook(const float* codebook,
                                                                  int64_t sets, int64_t codes,
                                                                  int64_t d);
void vq_decoder_append(const VQDecoderAppend& p, const Config& config);
void vq_decoder_query(const VQDecoderQuery& p, const Config& config);
/// The fused step (cpu/vq_decoder_fused_step.cpp).
void vq_decoder_step(const VQDecoderStep& p, const Config& config);

}  // namespace favor::cpu
