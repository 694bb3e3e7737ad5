#pragma once
// The pieces of the favor._core module, one function per file.
#include <pybind11/pybind11.h>

namespace favor::python {

void bind_projection(pybind11::module_& m);   // Projection, KernelFit, fit_kernel, optimal_a
void bind_attention(pybind11::module_& m);    // attention, backward, exact, features, metrics
void bind_feature_map(pybind11::module_& m);  // FeatureMap, attention_map(_backward), features_map
void bind_decoder(pybind11::module_& m);      // Decoder (after bind_feature_map)
// fit_features, floor_lambda, heldout_count (after bind_feature_map)
void bind_fit(pybind11::module_& m);
void bind_runtime(pybind11::module_& m);  // threads, build info, timing, reference
void bind_vq(pybind11::module_& m);  // Transformer-VQ, codebooks, VQDecoder (after bind_runtime)
void bind_exchange(pybind11::module_& m);  // Exchange, StateBlock, combine_states, stats
// sequence_parallel_attention(_map)(_backward) (after bind_exchange, bind_feature_map)
void bind_sequence_parallel(pybind11::module_& m);
void bind_rules(
    pybind11::module_& m);  // kernel names, fit rules, map files (after bind_feature_map)

}  // namespace favor::python
