#pragma once
// The streaming FAVOR decoder's steps on the CPU: append and query (kernels/decoder_params.hpp).
#include "cpu/config.hpp"
#include "cpu/contract.hpp"
#include "kernels/decoder_params.hpp"

namespace favor::cpu {

using kernels::DecoderAppend;
using kernels::DecoderQuery;
using kernels::DecoderStep;

void decoder_append(const DecoderAppend& p, const Config& config);
void decoder_query(const DecoderQuery& p, const Config& config);
/// The fused step (cpu/decoder_fused_step.cpp).
void decoder_step(const DecoderStep& p, const Config& config);

}  // namespace favor::cpu
