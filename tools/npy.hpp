#pragma once
// Reading and writing NumPy .npy files (format versions 1-3), for the favor CLI.
// Reading converts float64 to float32 and Fortran order to C order; every malformed,
// empty, truncated or unsupported file throws favor::Error naming the file and the rule.
#include <cstdint>
#include <string>
#include <vector>

namespace favor::cli {

struct NpyArray {
  std::vector<int64_t> shape;
  std::string descr;           // as in the file, e.g. "<f8"
  std::vector<float> values;   // C order, for float arrays
  std::vector<uint8_t> flags;  // C order, for bool/integer arrays (nonzero -> 1)
  int64_t numel() const;
};

/// A float32 or float64 array, returned as float32 in C order. Values must be finite
/// (checked by the library when used).
NpyArray read_float_npy(const std::string& path, const std::string& argument);
/// A bool or integer array (0 = false, else true), returned as flags in C order.
NpyArray read_mask_npy(const std::string& path, const std::string& argument);

/// The .npy bytes of a little-endian float32 C-order array.
std::string encode_npy_f32(const std::vector<int64_t>& shape, const float* data);

/// Output files staged as temporaries beside their targets and renamed into place by
/// commit(), all together; uncommitted temporaries are removed, so a failed command leaves
/// no partial output file behind.
class StagedOutputs {
 public:
  StagedOutputs() = default;
  StagedOutputs(const StagedOutputs&) = delete;
  StagedOutputs& operator=(const StagedOutputs&) = delete;
  ~StagedOutputs();
  void stage(const std::string& path, const std::string& bytes, const std::string& argument);
  void commit();
  /// The temporary path of the most recently staged file (for writers that fill it later).
  const std::string& last_temp() const { return entries_.back().temp; }

 private:
  struct Entry {
    std::string temp, target;
  };
  std::vector<Entry> entries_;
};

}  // namespace favor::cli
