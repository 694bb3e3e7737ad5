// The .npy header: magic, version, length and the Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// parsed by a small recursive-descent reader (no regex: its recursion overflows the stack on
// long fuzzed input), with every limit checked before anything is allocated.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "favor/error.hpp"
#include "npy.hpp"
#include "printable.hpp"

namespace favor::io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMaxItemBytes = size_t{1} << 20;  // a '<U262144' string at most

class DictReader {
 public:
  DictReader(std::string_view text, const std::string& where, const std::string& argument)
      : s_(text), where_(where), argument_(argument) {}

  [[noreturn]] void fail(const std::string& rule) const {
    throw Error(argument_ + ": " + where_ + ": header " + rule);
  }
  [[noreturn]] void expected(const char* what) const {
    fail(std::string("expected ") + what + " at byte " + std::to_string(i_) + ", found " +
         (i_ < s_.size() ? "'" + printable(s_.substr(i_, 16)) + "'" : "the end"));
  }
  void blanks() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  bool accept(char c) {
    blanks();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c, const char* what) {
    if (!accept(c)) expected(what);
  }
  bool at_end() {
    blanks();
    return i_ == s_.size();
  }
  char peek() {
    blanks();
    return i_ < s_.size() ? s_[i_] : '\0';
  }
  std::string string() {
    blanks();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) expected("a quoted string");
    const char quote = s_[i_++];
    const size_t end = s_.find(quote, i_);
    if (end == std::string_view::npos) fail("has an unterminated string");
    std::string out(s_.substr(i_, end - i_));
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    blanks();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      const size_t n = std::strlen(word);
      if (s_.substr(i_, n) == word) {
        i_ += n;
        return value;
      }
    }
    expected("True or False");
  }
  // A tuple of non-negative integers (a trailing L of Python 2 allowed).
  std::vector<int64_t> shape() {
    expect('(', "'(' opening the shape");
    std::vector<int64_t> dims;
    while (!accept(')')) {
      blanks();
      if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') expected("a dimension");
      int64_t v = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        v = v * 10 + (s_[i_++] - '0');
        if (v > kNpyMaxElements) {
          fail("declares a dimension over the maximum of " + std::to_string(kNpyMaxElements) +
               " elements");
        }
      }
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;
      dims.push_back(v);
      if (dims.size() > kNpyMaxRank)
        fail("declares more than " + std::to_string(kNpyMaxRank) + " dimensions");
      if (!accept(',')) {
        expect(')', "',' or ')' in the shape");
        break;
      }
    }
    return dims;
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
  const std::string& where_;
  const std::string& argument_;
};

// Bytes per element of a descr "<f4", "|b1", "<U12": 0 when it is not of that form.
size_t item_size_of(const std::string& descr) {
  if (descr.size() < 3 || descr.size() > 10) return 0;
  size_t n = 0;
  for (size_t i = 2; i < descr.size(); ++i) {
    if (descr[i] < '0' || descr[i] > '9') return 0;
    n = n * 10 + static_cast<size_t>(descr[i] - '0');
  }
  if (descr[1] == 'U') n *= 4;  // UTF-32 code units
  return n > 0 && n <= kMaxItemBytes ? n : 0;
}

[[noreturn]] void fail(const std::string& argument, const std::string& where,
                       const std::string& rule) {
  throw Error(argument + ": " + where + ": " + rule);
}

}  // namespace

int64_t NpyHeader::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;  // the parser bounds the product
  return n;
}

NpyHeader parse_npy_header(std::string_view bytes, const std::string& where,
                           const std::string& argument) {
  if (bytes.size() < 10 || bytes.compare(0, 6, std::string_view(kMagic, 6)) != 0)
    fail(argument, where, "not a .npy file (bad magic)");
  const auto major = static_cast<unsigned char>(bytes[6]);
  const auto minor = static_cast<unsigned char>(bytes[7]);
  if ((major < 1 || major > 3) || minor != 0) {
    fail(argument, where,
         "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor));
  }
  size_t len = 0, start = 10;
  const auto byte = [&](size_t i) {
    return static_cast<size_t>(static_cast<unsigned char>(bytes[i]));
  };
  if (major == 1) {
    len = byte(8) | byte(9) << 8;
  } else {
    if (bytes.size() < 12) fail(argument, where, "truncated header");
    len = byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
    start = 12;
  }
  if (len > kNpyMaxHeaderBytes) {
    fail(argument, where,
         "header of " + std::to_string(len) + " bytes is over the maximum of " +
             std::to_string(kNpyMaxHeaderBytes));
  }
  if (bytes.size() < start + len) fail(argument, where, "truncated header");
  DictReader r(bytes.substr(start, len), where, argument);
  NpyHeader h;
  h.data_offset = start + len;
  bool seen[3] = {false, false, false};
  r.expect('{', "'{' opening the header");
  while (!r.accept('}')) {
    const std::string key = r.string();
    r.expect(':', "':' after a key");
    int k = -1;
    if (key == "descr") {
      k = 0;
      if (r.peek() == '[') r.fail("describes a structured dtype; favor reads plain arrays");
      h.descr = r.string();
    } else if (key == "fortran_order") {
      k = 1;
      h.fortran = r.boolean();
    } else if (key == "shape") {
      k = 2;
      h.shape = r.shape();
    } else {
      r.fail("has an unknown key '" + printable(key) + "'");
    }
    if (seen[k]) r.fail("repeats the key '" + key + "'");
    seen[k] = true;
    if (!r.accept(',')) {
      r.expect('}', "',' or '}' after a value");
      break;
    }
  }
  if (!r.at_end()) r.expected("only blanks after the header's '}'");
  if (!seen[0]) r.fail("has no 'descr'");
  if (!seen[1]) r.fail("has no 'fortran_order'");
  if (!seen[2]) r.fail("has no 'shape'");
  // The product of the dimensions, bounded before anyone multiplies it by an item size.
  int64_t n = 1;
  bool zero = false;
  for (int64_t s : h.shape) {
    if (s == 0)
      zero = true;
    else if (!zero && n > kNpyMaxElements / s)
      n = kNpyMaxElements + 1;
    else if (!zero)
      n *= s;
  }
  if (!zero && n > kNpyMaxElements) {
    fail(
        argument, where,
        "shape declares more than the maximum of " + std::to_string(kNpyMaxElements) + " elements");
  }
  h.item = item_size_of(h.descr);
  if (h.item == 0) {
    fail(argument, where, "dtype '" + printable(h.descr) + "' is not a plain numeric dtype");
  }
  return h;
}

NpyHeader read_npy_header(const std::string& path, const std::string& argument) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(argument, path, std::string("cannot open (") + std::strerror(errno) + ")");
  struct stat st {};
  std::string bytes(12 + kNpyMaxHeaderBytes, '\0');
  const ssize_t got = ::fstat(fd, &st) == 0 ? ::pread(fd, bytes.data(), bytes.size(), 0) : -1;
  const int saved = errno;
  ::close(fd);
  if (got < 0) fail(argument, path, std::string("read error (") + std::strerror(saved) + ")");
  if (got == 0) fail(argument, path, "empty file");
  bytes.resize(static_cast<size_t>(got));
  NpyHeader h = parse_npy_header(bytes, path, argument);
  if (h.numel() == 0) fail(argument, path, "array has no elements");
  const uint64_t need = h.data_offset + static_cast<uint64_t>(h.numel()) * h.item;
  if (static_cast<uint64_t>(st.st_size) < need) {
    fail(argument, path,
         "truncated: " + std::to_string(need) + " bytes expected, " +
             std::to_string(static_cast<uint64_t>(st.st_size)) + " found");
  }
  return h;
}

}  // namespace favor::io
