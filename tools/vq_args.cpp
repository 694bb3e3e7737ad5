#include "vq_args.hpp"

#include <cmath>

#include "io_names.hpp"

namespace favor::cli {

void add_vq_options(CLI::App* cmd, VQArgs& a) {
  cmd->add_option("--codes", a.codes,
                  "vq: codes c per head (required without --codebook; must match one)");
  cmd->add_option("--vq-tau", a.tau, "vq: 0 = hard VQ, > 0 = soft VQ temperature tau")
      ->capture_default_str();
  cmd->add_option("--codebook", a.codebook,
                  "vq: codebook .npy, [c, D] (shared by all heads) or [H, c, D]; default: "
                  "learned from the keys by k-means (bidirectional only)");
  cmd->add_option("--vq-block", a.block, "vq: causal block length L (0: the library's default)")
      ->capture_default_str();
  cmd->add_option("--vq-iterations", a.iterations,
                  "vq without --codebook: Lloyd iterations of the k-means (seeded by --seed)")
      ->capture_default_str();
  cmd->add_option("--save-codebook", a.save, "vq: also write the codebook used, as --codebook");
}

int64_t keys_per_codebook(const Shape4& keys, const std::optional<KeyMaskView>& mask, bool shared) {
  int64_t per_head = keys[0] * keys[2];
  if (mask) {
    per_head = 0;
    for (int64_t b = 0; b < mask->batch; ++b)
      for (int64_t j = 0; j < mask->n; ++j) per_head += mask->at(b, j) ? 1 : 0;
  }
  return shared ? per_head * keys[1] : per_head;
}

void check_codes(int64_t codes, int64_t keys, const std::string& option) {
  if (codes < 1) throw Error(option + ": " + std::to_string(codes) + " must be >= 1");
  if (codes > keys) {
    throw Error(option + ": " + std::to_string(codes) + " codes need at least as many keys per " +
                "codebook, there are " + std::to_string(keys) + " (unmasked)");
  }
}

Tensor read_codebook(const std::string& path, int64_t heads, int64_t d,
                     std::optional<int64_t> codes) {
  NpyArray c = read_float_npy(path, "--codebook");
  const size_t rank = c.shape.size();
  if (rank != 2 && rank != 3) {
    throw Error("--codebook: " + path + ": must be [c, D] or [H, c, D], has rank " +
                std::to_string(rank));
  }
  const int64_t hc = rank == 3 ? c.shape[0] : 1, n = c.shape[rank - 2], cd = c.shape[rank - 1];
  if (cd != d) {
    throw Error("--codebook: " + path + ": has D = " + std::to_string(cd) +
                ", the inputs have D = " + std::to_string(d));
  }
  if (hc != heads && hc != 1) {
    throw Error("--codebook: " + path + ": has " + std::to_string(hc) +
                " heads, the inputs have H = " + std::to_string(heads) + " (or give 1)");
  }
  if (n < 1) throw Error("--codebook: " + path + ": has no codes");
  if (codes && *codes != n) {
    throw Error("--codes: " + std::to_string(*codes) + " disagrees with --codebook " + path +
                ", which has c = " + std::to_string(n));
  }
  for (size_t i = 0; i < c.values.size(); ++i) {
    if (!std::isfinite(c.values[i]))
      throw Error("--codebook: " + path + ": element " + std::to_string(i) +
                  " (C order) is not finite");
  }
  return Tensor({1, hc, n, d}, std::move(c.values));
}

std::vector<int64_t> codebook_file_shape(const Shape4& s, bool rank2) {
  return rank2 ? std::vector<int64_t>{s[2], s[3]} : std::vector<int64_t>{s[1], s[2], s[3]};
}

}  // namespace favor::cli
