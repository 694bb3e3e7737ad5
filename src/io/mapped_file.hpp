#pragma once
// A whole input file in memory without copying it: a read-only private mapping of a regular
// file, or, for what cannot be mapped (a pipe, /dev/stdin), its bytes read once.
#include <cstddef>
#include <string>
#include <string_view>

namespace favor::io {

class MappedFile {
 public:
  /// Maps `path`; a missing, unreadable or empty file throws favor::Error naming `argument`
  /// and `path`.
  MappedFile(const std::string& path, const std::string& argument);
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::string_view bytes() const { return {data_, size_}; }
  bool mapped() const { return mapped_; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::string read_;  // the bytes of a file that could not be mapped
};

}  // namespace favor::io
