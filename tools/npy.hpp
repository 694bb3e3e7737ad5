#pragma once
// Reading and writing NumPy .npy files (format versions 1-3), for the favor CLI.
// Reading converts float64 to float32 and Fortran order to C order; every malformed,
// empty, truncated or unsupported file throws favor::Error naming the file and the rule.
// The decode_* functions read .npy bytes held in memory (members of an .npz, npz.hpp);
// `where` names them in messages.
#include <cstddef>
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

/// The header of a .npy file and where its data begins. read_npy_header reads only the
/// header's bytes, and checks that the file holds all the data the header announces.
struct NpyHeader {
  std::string descr;  // e.g. "<f4"
  bool fortran = false;
  std::vector<int64_t> shape;
  size_t data_offset = 0;  // bytes before the first element
  size_t item = 0;         // bytes per element
  int64_t numel() const;
};
NpyHeader read_npy_header(const std::string& path, const std::string& argument);

/// A float32 or float64 array, returned as float32 in C order. Values must be finite
/// (checked by the library when used).
NpyArray read_float_npy(const std::string& path, const std::string& argument);
/// A bool or integer array (0 = false, else true), returned as flags in C order.
NpyArray read_mask_npy(const std::string& path, const std::string& argument);
/// The whole file; a missing, unreadable or empty file throws naming `argument` and `path`.
std::string read_file(const std::string& path, const std::string& argument);

/// read_float_npy of bytes in memory.
NpyArray decode_float_npy(std::string bytes, const std::string& where, const std::string& argument);
/// One value (a 0-d array, or any shape with one element): float32 / float64.
double decode_float_scalar_npy(std::string bytes, const std::string& where,
                               const std::string& argument);
/// One value: a little-endian (u)int8..64 or bool, as int64 (uint64 beyond int64 throws).
int64_t decode_int_scalar_npy(std::string bytes, const std::string& where,
                              const std::string& argument);
/// One numpy unicode string ('<Un', UTF-32LE, NUL-padded); printable ASCII only.
std::string decode_unicode_npy(std::string bytes, const std::string& where,
                               const std::string& argument);

/// The .npy bytes (format 1.0, C order) of `bytes` of data with dtype `descr` and `shape`
/// ({} for a 0-d array).
std::string encode_npy(const std::string& descr, const std::vector<int64_t>& shape,
                       const void* data, size_t bytes);
/// The .npy bytes of a little-endian float32 C-order array.
std::string encode_npy_f32(const std::vector<int64_t>& shape, const float* data);
/// 0-d arrays: float64 '<f8', int64 '<i8', unicode '<U{width}' (ASCII text, at most width
/// characters; longer throws favor::Error).
std::string encode_npy_f64_scalar(double value);
std::string encode_npy_i64_scalar(int64_t value);
std::string encode_npy_unicode(const std::string& text, size_t width);

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
