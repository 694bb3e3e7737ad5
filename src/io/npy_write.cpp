// Writing .npy files: the header, and outputs staged beside their targets until commit().
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "favor/error.hpp"
#include "npy.hpp"

namespace favor::io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

[[noreturn]] void fail(const std::string& argument, const std::string& path,
                       const std::string& rule) {
  throw Error(argument + ": " + path + ": " + rule);
}

size_t count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

}  // namespace

std::string encode_npy_header(const std::string& descr, const std::vector<int64_t>& shape) {
  std::string tuple = "(";
  for (size_t i = 0; i < shape.size(); ++i) tuple += (i ? ", " : "") + std::to_string(shape[i]);
  tuple += shape.size() == 1 ? ",)" : ")";
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + tuple + ", }";
  // Pad with spaces so the data starts on a 64-byte boundary; end with a newline.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::string out(kMagic, 6);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>((dict.size() >> 8) & 0xff);
  out += dict;
  return out;
}

std::string encode_npy(const std::string& descr, const std::vector<int64_t>& shape,
                       const void* data, size_t bytes) {
  std::string out = encode_npy_header(descr, shape);
  out.append(static_cast<const char*>(data), bytes);
  return out;
}

std::string encode_npy_f32(const std::vector<int64_t>& shape, const float* data) {
  return encode_npy("<f4", shape, data, count(shape) * sizeof(float));
}

std::string encode_npy_f64_scalar(double value) {
  return encode_npy("<f8", {}, &value, sizeof value);
}

std::string encode_npy_i64_scalar(int64_t value) {
  return encode_npy("<i8", {}, &value, sizeof value);
}

std::string encode_npy_unicode(const std::string& text, size_t width) {
  if (text.size() > width) throw Error("'" + text + "' is longer than " + std::to_string(width));
  std::vector<uint32_t> units(width, 0);
  for (size_t i = 0; i < text.size(); ++i) units[i] = static_cast<unsigned char>(text[i]);
  return encode_npy("<U" + std::to_string(width), {}, units.data(), 4 * width);
}

StagedOutputs::~StagedOutputs() {
  for (const Entry& e : entries_) std::remove(e.temp.c_str());
}

void StagedOutputs::stage(const std::string& path, const std::string& bytes,
                          const std::string& argument) {
  write_parts(path, bytes, {}, argument);
}

void StagedOutputs::stage_f32(const std::string& path, const std::vector<int64_t>& shape,
                              const float* data, const std::string& argument) {
  const std::string head = encode_npy_header("<f4", shape);
  write_parts(path, head, {reinterpret_cast<const char*>(data), count(shape) * sizeof(float)},
              argument);
}

void StagedOutputs::write_parts(const std::string& path, std::string_view head,
                                std::string_view body, const std::string& argument) {
  std::string temp = path + ".partial-XXXXXX";
  const int fd = mkstemp(temp.data());
  if (fd < 0)
    fail(argument, path, std::string("cannot create output (") + std::strerror(errno) + ")");
  entries_.push_back({temp, path});
  const mode_t mask = ::umask(0);  // mkstemp creates 0600; give the usual 0666 & ~umask
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  iovec parts[2] = {{const_cast<char*>(head.data()), head.size()},
                    {const_cast<char*>(body.data()), body.size()}};
  size_t first = 0, total = head.size() + body.size();
  while (total > 0) {  // one gathered write, resumed where a short write stopped
    const ssize_t n = ::writev(fd, parts + first, static_cast<int>(2 - first));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(n < 0 ? errno : ENOSPC);
      ::close(fd);
      fail(argument, path, "write failed (" + why + ")");
    }
    total -= static_cast<size_t>(n);
    auto done = static_cast<size_t>(n);
    while (first < 2 && done >= parts[first].iov_len) done -= parts[first++].iov_len;
    if (first < 2) {
      parts[first].iov_base = static_cast<char*>(parts[first].iov_base) + done;
      parts[first].iov_len -= done;
    }
  }
  if (::close(fd) != 0)
    fail(argument, path, std::string("write failed (") + std::strerror(errno) + ")");
}

void StagedOutputs::commit() {
  for (Entry& e : entries_) {
    if (std::rename(e.temp.c_str(), e.target.c_str()) != 0) {
      fail("output", e.target,
           std::string("cannot move into place (") + std::strerror(errno) + ")");
    }
    e.temp.clear();
  }
  entries_.clear();
}

}  // namespace favor::io
