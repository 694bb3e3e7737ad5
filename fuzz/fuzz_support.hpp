#pragma once
// Helpers shared by the fuzz targets (fuzz/*.cpp): reading fuzzed bytes as choices, a
// per-process scratch directory for the loaders that take a path, and the rule of what a
// target may throw. Built with libFuzzer (`make fuzz`) or with replay_main.cpp (CTest).
#include <cstddef>
#include <cstdint>
#include <string>

namespace favor::fuzz {

/// Consumes fuzzed bytes from the front; once they run out every read returns 0, so any
/// input decodes to some choice (as libFuzzer's FuzzedDataProvider, which gcc builds lack).
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  /// A value in [0, n) (n >= 1).
  uint32_t below(uint32_t n) { return n <= 256 ? byte() % n : (byte() | byte() << 8) % n; }
  bool flag() { return byte() & 1; }
  size_t left() const { return size_ - pos_; }
  /// The remaining bytes.
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_ - pos_);
    pos_ = size_;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

/// A directory of this process, created once under $FAVOR_FUZZ_TMPDIR, else /dev/shm, else
/// /tmp; removed at exit.
const std::string& scratch_dir();
/// Writes `bytes` to `name` in scratch_dir() and returns its path.
std::string write_scratch(const std::string& name, const std::string& bytes);

/// The caught exception is one the entry point may throw on bad input: favor::Error.
/// Anything else (std::bad_alloc, std::length_error, std::out_of_range ...) escaping a
/// decoder is a finding: the target aborts with its message so libFuzzer records the input.
[[noreturn]] void unexpected_exception(const char* target, const char* what);

/// Error messages quote file contents escaped (docs/reliability.md): a byte outside printable
/// ASCII in `message` is a finding (the target aborts).
void require_printable(const char* target, const char* message);
/// What the CLI prints: no control byte, and bytes above 0x7f only as valid UTF-8 (then
/// terminal_safe leaves the text unchanged); aborts otherwise.
void require_terminal_safe(const char* target, const std::string& line);

}  // namespace favor::fuzz
