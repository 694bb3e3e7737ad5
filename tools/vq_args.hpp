#pragma once
// Transformer-VQ pieces shared by `favor attention --method vq` and `favor codebook`: the
// codebook options, reading a codebook .npy, and learning one by k-means with the checks
// named after the CLI's options.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "favor/favor.hpp"

namespace favor::cli {

struct VQArgs {
  std::optional<int64_t> codes;  // --codes
  double tau = 0.0;              // --vq-tau
  std::string codebook;          // --codebook
  int64_t block = 0;             // --vq-block
  int64_t iterations = 25;       // --vq-iterations
  std::string save;              // --save-codebook
};

void add_vq_options(CLI::App* cmd, VQArgs& args);

/// Keys that take part per codebook: every unmasked key of every batch, per head, or of all
/// heads when one codebook is shared.
int64_t keys_per_codebook(const Shape4& keys, const std::optional<KeyMaskView>& mask, bool shared);

/// Refuses codes < 1 or more codes than keys per codebook, naming `option`.
void check_codes(int64_t codes, int64_t keys, const std::string& option);

/// A codebook file [c, D] (shared by all heads) or [Hc, c, D] with Hc = heads or 1, as
/// [1, Hc, c, D]. `codes`, when given, must equal c.
Tensor read_codebook(const std::string& path, int64_t heads, int64_t d,
                     std::optional<int64_t> codes);

/// The codebook file's shape for a [1, Hc, c, D] codebook: [c, D] when `rank2`, else
/// [Hc, c, D].
std::vector<int64_t> codebook_file_shape(const Shape4& codebook, bool rank2);

}  // namespace favor::cli
