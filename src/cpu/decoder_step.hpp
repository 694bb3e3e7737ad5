#pragma once
// The streaming FAVOR decoder's steps on the CPU: append and query (kernels/decoder_params.hpp).
#include "cpu/config.hpp"
#include "cpu/contract.hpp"
#include "kernels/decoder_params.hpp"

namespace favor::cpu {

using kernels::DecoderAppend;
using kernels::DecoderQuery;

void decoder_append(const DecoderAppend& p, const Config& config);
void decoder_query(const DecoderQuery& p, const Config& config);

}  // namespace favor::cpu
