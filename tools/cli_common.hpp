#pragma once
// Pieces shared by the favor subcommands: projection options, .npy <-> tensor conversion.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "favor/favor.hpp"
#include "io_names.hpp"

namespace favor::cli {

struct ProjectionArgs {
  int64_t features = 256;
  std::string kind = "orthogonal";
  std::string norms = "chi";
  uint64_t seed = 0;
  std::string file;  // --projection-file
  std::string save;  // --save-projection
  CLI::Option* features_opt = nullptr;
  CLI::Option* kind_opt = nullptr;
  CLI::Option* norms_opt = nullptr;
  CLI::Option* seed_opt = nullptr;
};

void add_projection_options(CLI::App* app, ProjectionArgs& args);
/// Draws W or loads it from --projection-file (an [m, d] array with d == D).
Projection make_projection(const ProjectionArgs& args, int64_t d);

/// An input tensor read from .npy: rank 2 [N, D] (one head) or 4 [B, H, N, D]. A
/// little-endian float32 C-order file is viewed in place in its mapping.
struct InputTensor {
  TensorView tensor;  // C-contiguous, in `storage`
  size_t rank = 4;
  std::shared_ptr<const void> storage;  // the mapped file or the converted values
  const Shape4& shape() const { return tensor.shape; }
  /// An owning copy.
  Tensor copy() const;
};
InputTensor read_tensor(const std::string& path, const std::string& argument);
/// Mask [B, Nk] (rank-4 inputs) or [Nk] (rank-2 inputs).
std::vector<uint8_t> read_mask(const std::string& path, size_t input_rank, int64_t batch,
                               int64_t nk);
/// The .npy bytes of a tensor written back in the inputs' rank.
std::string encode_tensor(const Tensor& t, size_t rank);
/// Stages `t` as the .npy file `path` in the inputs' rank (written straight from its data).
void stage_tensor(StagedOutputs& outputs, const std::string& path, const Tensor& t, size_t rank,
                  const std::string& argument);

}  // namespace favor::cli
