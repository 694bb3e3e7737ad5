#include "mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "favor/error.hpp"

namespace favor::io {
namespace {

[[noreturn]] void fail(const std::string& argument, const std::string& path,
                       const std::string& rule) {
  throw Error(argument + ": " + path + ": " + rule);
}

std::string reason(const char* what) {
  return std::string(what) + " (" + std::strerror(errno) + ")";
}

}  // namespace

MappedFile::MappedFile(const std::string& path, const std::string& argument) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(argument, path, reason("cannot open"));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = reason("cannot stat");
    ::close(fd);
    fail(argument, path, why);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    fail(argument, path, "is a directory, not a file");
  }
  if (S_ISREG(st.st_mode) && st.st_size > 0) {
    // MAP_POPULATE reads the whole file ahead: one pass, no page fault per 4 KiB later.
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                     MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p != MAP_FAILED) {
      ::close(fd);
      data_ = static_cast<const char*>(p);
      size_ = static_cast<size_t>(st.st_size);
      mapped_ = true;
      return;
    }
  }
  // Not mappable (a pipe, a character device, a file system without mmap): read it all.
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = reason("read error");
      ::close(fd);
      fail(argument, path, why);
    }
    read_.append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  if (read_.empty()) fail(argument, path, "empty file");
  data_ = read_.data();
  size_ = read_.size();
}

MappedFile::~MappedFile() {
  if (mapped_) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace favor::io
