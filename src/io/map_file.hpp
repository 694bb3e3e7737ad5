#pragma once
// Fitted feature maps on disk, shared with the Python package: an .npz (npz.hpp) with
//   kernel      0-d '<U16'  "hedgehog" | "positive" | "trig" | "hyperbolic"
//   scale       0-d float64 the resolved temperature (1/sqrt(D) when the map had none)
//   projection  float32 [m, d]   the base projection W
//   heads       0-d int64        parameter sets
//   weights     float32 [heads, m, d]  (optional)
//   bias        float32 [heads, m]     (optional)
//   lambda      float32 [heads, m]     (optional; nonzero)
// and feature weights alone (--feature-weights): a float32/float64 .npy [m] or [H, m].
#include <string>
#include <vector>

#include "favor/favor.hpp"

namespace favor::io {

/// The .npz bytes of `map`. Throws favor::Error for FAVOR++ / FAVOR# maps (their fit is not
/// part of the format).
std::string encode_map_file(const FeatureMap& map);

/// The map in the file at `path`; every missing member, wrong dtype or shape, bad value and
/// malformed or truncated archive throws favor::Error naming `argument` and the file.
/// Unknown members are ignored.
FeatureMap read_map_file(const std::string& path, const std::string& argument);
/// read_map_file of the file's bytes (`path` names them in messages).
FeatureMap decode_map_file(const std::string& bytes, const std::string& path,
                           const std::string& argument);

/// Feature weights lambda from an [m] (one set, shared by every head) or [H, m] .npy
/// (`heads` = H of the inputs); sets `sets` to 1 or H.
std::vector<float> read_feature_weights(const std::string& path, const std::string& argument,
                                        int64_t m, int64_t heads, int64_t& sets);

}  // namespace favor::io
