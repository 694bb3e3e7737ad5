#pragma once
// Reading and writing NumPy .npy files (format versions 1-3), for the favor CLI and the Python
// package (favor_io).
// Files are mapped, not read through a stream: a little-endian float32 C-order array is used
// in place; float16/32/64 of either byte order and Fortran order are converted to float32 C
// order in one pass. Every malformed, empty, truncated, oversized or unsupported file throws
// favor::Error naming the argument, the file and the rule; quoted header text is escaped.
// The decode_* functions read .npy bytes held in memory (members of an .npz, npz.hpp);
// `where` names them in messages.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mapped_file.hpp"

namespace favor::io {

/// Limits on what a header may declare, checked before anything is allocated. The data a
/// header announces must also be present in the file, so reading allocates at most 4 bytes
/// per element the file holds (none for float32 used in place).
inline constexpr size_t kNpyMaxHeaderBytes = 65536;  // numpy writes a few hundred
inline constexpr size_t kNpyMaxRank = 32;            // numpy's NPY_MAXDIMS before 2.0
inline constexpr int64_t kNpyMaxElements = int64_t{1} << 40;

/// The header of a .npy file and where its data begins.
struct NpyHeader {
  std::string descr;  // as in the file, e.g. "<f4"
  bool fortran = false;
  std::vector<int64_t> shape;
  size_t data_offset = 0;  // bytes before the first element
  size_t item = 0;         // bytes per element
  int64_t numel() const;
};

/// Parses the header at the start of `bytes` (which may hold the header alone). Checks the
/// magic, the version, the dictionary's grammar and the limits above, not the dtype.
NpyHeader parse_npy_header(std::string_view bytes, const std::string& where,
                           const std::string& argument);
/// The header of the file at `path` (reads only its bytes), checking that the file holds all
/// the data the header announces.
NpyHeader read_npy_header(const std::string& path, const std::string& argument);

/// A float array as float32 in C order: in place in the mapped file, or converted.
struct FloatNpy {
  NpyHeader header;
  const float* data = nullptr;          // numel() values
  std::shared_ptr<const void> storage;  // keeps `data` alive: the mapping or the converted copy
  const std::vector<int64_t>& shape() const { return header.shape; }
  int64_t numel() const { return header.numel(); }
  bool in_place = false;  // data points into the mapped file
};
/// The float16/32/64 array (either byte order, C or Fortran order) of the file at `path`.
/// Values must be finite (checked by the library when used).
FloatNpy map_float_npy(const std::string& path, const std::string& argument);

/// An array copied out of its file: float values or mask flags, C order.
struct NpyArray {
  std::vector<int64_t> shape;
  std::string descr;           // as in the file, e.g. "<f8"
  std::vector<float> values;   // C order, for float arrays
  std::vector<uint8_t> flags;  // C order, for bool/integer arrays (nonzero -> 1)
  int64_t numel() const;
};

/// map_float_npy, copied into an NpyArray (for small arrays: projections, codebooks).
NpyArray read_float_npy(const std::string& path, const std::string& argument);
/// A bool or integer array (0 = false, else true), returned as flags in C order.
NpyArray read_mask_npy(const std::string& path, const std::string& argument);
/// The whole file; a missing, unreadable or empty file throws naming `argument` and `path`.
std::string read_file(const std::string& path, const std::string& argument);

/// read_float_npy of bytes in memory.
NpyArray decode_float_npy(std::string_view bytes, const std::string& where,
                          const std::string& argument);
/// One value (a 0-d array, or any shape with one element): float16 / float32 / float64.
double decode_float_scalar_npy(std::string_view bytes, const std::string& where,
                               const std::string& argument);
/// One value: an (u)int8..64 or bool, as int64 (uint64 beyond int64 throws).
int64_t decode_int_scalar_npy(std::string_view bytes, const std::string& where,
                              const std::string& argument);
/// One numpy unicode string ('<Un', UTF-32LE, NUL-padded); printable ASCII only.
std::string decode_unicode_npy(std::string_view bytes, const std::string& where,
                               const std::string& argument);

/// The .npy header (format 1.0, C order, padded so the data starts at a multiple of 64) of
/// data with dtype `descr` and `shape` ({} for a 0-d array).
std::string encode_npy_header(const std::string& descr, const std::vector<int64_t>& shape);
/// The .npy bytes of `bytes` of data with dtype `descr` and `shape`.
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
  /// A float32 C-order array as .npy: its header and the data written straight from `data`
  /// (one gathered write, no copy).
  void stage_f32(const std::string& path, const std::vector<int64_t>& shape, const float* data,
                 const std::string& argument);
  void commit();
  /// The temporary path of the most recently staged file (for writers that fill it later).
  const std::string& last_temp() const { return entries_.back().temp; }

 private:
  struct Entry {
    std::string temp, target;
  };
  void write_parts(const std::string& path, std::string_view head, std::string_view body,
                   const std::string& argument);
  std::vector<Entry> entries_;
};

}  // namespace favor::io
