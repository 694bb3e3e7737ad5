#include "npy.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>

#include "favor/error.hpp"

namespace favor::cli {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

struct Header {
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
  size_t data_offset = 0;
};

[[noreturn]] void fail(const std::string& argument, const std::string& path,
                       const std::string& rule) {
  throw Error(argument + ": " + path + ": " + rule);
}

Header parse_header(const std::string& bytes, const std::string& path,
                    const std::string& argument) {
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic, 6) != 0)
    fail(argument, path, "not a .npy file (bad magic)");
  const auto major = static_cast<unsigned char>(bytes[6]);
  size_t len = 0, start = 0;
  if (major == 1) {
    len = static_cast<unsigned char>(bytes[8]) |
          (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(argument, path, "truncated header");
    for (int i = 0; i < 4; ++i)
      len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    start = 12;
  } else {
    fail(argument, path, "unsupported .npy format version " + std::to_string(major));
  }
  if (bytes.size() < start + len) fail(argument, path, "truncated header");
  const std::string dict = bytes.substr(start, len);
  Header h;
  h.data_offset = start + len;
  // Compiled once (thread-safe statics): .npz map files parse several headers per read.
  static const std::regex descr(R"('descr'\s*:\s*'([^']*)')"),
      fortran(R"('fortran_order'\s*:\s*(True|False))"), shape(R"('shape'\s*:\s*\(([^)]*)\))"),
      blanks(R"(\s+|L)");
  std::smatch match;
  if (!std::regex_search(dict, match, descr)) fail(argument, path, "header has no 'descr'");
  h.descr = match[1];
  if (!std::regex_search(dict, match, fortran)) {
    fail(argument, path, "header has no 'fortran_order'");
  }
  h.fortran = match[1] == "True";
  if (!std::regex_search(dict, match, shape)) fail(argument, path, "header has no 'shape'");
  std::stringstream dims(match[1].str());
  std::string item;
  while (std::getline(dims, item, ',')) {
    item = std::regex_replace(item, blanks, "");
    if (item.empty()) continue;
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0) throw std::invalid_argument(item);
      h.shape.push_back(v);
    } catch (const std::exception&) {
      fail(argument, path, "bad shape entry '" + item + "'");
    }
  }
  return h;
}

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Index in C order of the element at Fortran-order position f.
std::vector<size_t> fortran_to_c(const std::vector<int64_t>& shape) {
  const size_t n = static_cast<size_t>(count(shape));
  std::vector<size_t> map(n);
  std::vector<int64_t> idx(shape.size(), 0);
  for (size_t f = 0; f < n; ++f) {
    size_t c = 0;
    for (size_t a = 0; a < shape.size(); ++a)
      c = c * static_cast<size_t>(shape[a]) + static_cast<size_t>(idx[a]);
    map[f] = c;
    for (size_t a = 0; a < shape.size(); ++a) {  // Fortran order: first axis fastest
      if (++idx[a] < shape[a]) break;
      idx[a] = 0;
    }
  }
  return map;
}

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Bytes per element; numpy unicode '<Un' has n UTF-32 code units of 4 bytes.
size_t item_size_of(const std::string& descr) {
  if (descr.size() < 3) return 0;
  try {
    const auto n = static_cast<size_t>(std::stoul(descr.substr(2)));
    return descr[1] == 'U' ? 4 * n : n;
  } catch (const std::exception&) {
    return 0;
  }
}

struct Loaded {
  Header header;
  std::string bytes;
  size_t item = 0;
  std::vector<size_t> c_index;  // Fortran position -> C position; empty for C order
  const char* data() const { return bytes.data() + header.data_offset; }
  size_t at(size_t i) const { return c_index.empty() ? i : c_index[i]; }
};

// Parses .npy bytes, checks the dtype with `accept` (else fails with `rule`), the data size
// and a non-empty shape, and precomputes the Fortran-to-C index map. `path` names the bytes
// in messages (a file, or a file and its .npz member).
template <class Accept>
Loaded load_checked(std::string bytes, const std::string& path, const std::string& argument,
                    Accept accept, const std::string& rule) {
  if (bytes.empty()) fail(argument, path, "empty, not a .npy array");
  Loaded l{{}, std::move(bytes), 0, {}};
  l.header = parse_header(l.bytes, path, argument);
  if (!accept(l.header.descr))
    fail(argument, path, "dtype '" + l.header.descr + "' is not supported; " + rule);
  l.item = item_size_of(l.header.descr);
  const size_t need = static_cast<size_t>(count(l.header.shape)) * l.item;
  const size_t have = l.bytes.size() - l.header.data_offset;
  if (have < need) {
    fail(argument, path,
         "truncated: " + std::to_string(need) + " bytes of data expected, " + std::to_string(have) +
             " found");
  }
  if (l.item == 0) fail(argument, path, "dtype '" + l.header.descr + "' has no element size");
  if (count(l.header.shape) == 0) fail(argument, path, "array has no elements");
  if (l.header.fortran && l.header.shape.size() > 1) l.c_index = fortran_to_c(l.header.shape);
  return l;
}

}  // namespace

int64_t NpyArray::numel() const {
  return count(shape);
}

int64_t NpyHeader::numel() const {
  return count(shape);
}

NpyHeader read_npy_header(const std::string& path, const std::string& argument) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(argument, path, std::string("cannot open (") + std::strerror(errno) + ")");
  std::string bytes(12, '\0');  // magic, version, header length (up to 4 bytes)
  in.read(bytes.data(), 12);
  bytes.resize(static_cast<size_t>(in.gcount()));
  if (bytes.empty()) fail(argument, path, "empty file");
  // The header's length is in bytes 8-9 (version 1) or 8-11; parse_header reports a bad one.
  size_t len = 0, start = 10;
  if (bytes.size() >= 12 && (bytes[6] == 2 || bytes[6] == 3)) {
    start = 12;
    for (int i = 0; i < 4; ++i)
      len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  } else if (bytes.size() >= 10) {
    len = static_cast<unsigned char>(bytes[8]) |
          (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  }
  if (len > (1u << 24)) fail(argument, path, "header longer than 16 MiB");
  bytes.resize(start + len);
  in.clear();
  in.seekg(0);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  bytes.resize(static_cast<size_t>(in.gcount()));
  const Header h = parse_header(bytes, path, argument);
  NpyHeader out{h.descr, h.fortran, h.shape, h.data_offset, item_size_of(h.descr)};
  if (out.item == 0) fail(argument, path, "dtype '" + h.descr + "' has no element size");
  if (count(h.shape) == 0) fail(argument, path, "array has no elements");
  struct stat st {};
  const size_t need = h.data_offset + static_cast<size_t>(count(h.shape)) * out.item;
  if (::stat(path.c_str(), &st) != 0 || static_cast<size_t>(st.st_size) < need) {
    fail(argument, path,
         "truncated: " + std::to_string(need) + " bytes expected, " +
             std::to_string(static_cast<size_t>(st.st_size)) + " found");
  }
  return out;
}

std::string read_file(const std::string& path, const std::string& argument) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(argument, path, std::string("cannot open (") + std::strerror(errno) + ")");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(argument, path, "read error");
  if (bytes.empty()) fail(argument, path, "empty file");
  return bytes;
}

NpyArray read_float_npy(const std::string& path, const std::string& argument) {
  return decode_float_npy(read_file(path, argument), path, argument);
}

NpyArray decode_float_npy(std::string bytes, const std::string& where,
                          const std::string& argument) {
  const Loaded l = load_checked(
      std::move(bytes), where, argument,
      [](const std::string& d) { return d == "<f4" || d == "<f8" || d == "=f4" || d == "=f8"; },
      "use little-endian float32 or float64");
  NpyArray a{l.header.shape, l.header.descr, {}, {}};
  const size_t n = static_cast<size_t>(a.numel());
  a.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    a.values[l.at(i)] = l.item == 4 ? load<float>(l.data() + 4 * i)
                                    : static_cast<float>(load<double>(l.data() + 8 * i));
  }
  return a;
}

namespace {

bool little_integer(const std::string& d) {
  if (d == "|b1" || d == "|u1" || d == "|i1") return true;
  if (d.size() < 3) return false;
  const std::string size = d.substr(2);
  return (d[0] == '<' || d[0] == '=') && (d[1] == 'i' || d[1] == 'u') &&
         (size == "2" || size == "4" || size == "8");
}

template <class Accept>
Loaded load_scalar(std::string bytes, const std::string& where, const std::string& argument,
                   Accept accept, const std::string& rule) {
  Loaded l = load_checked(std::move(bytes), where, argument, accept, rule);
  if (count(l.header.shape) != 1) {
    fail(argument, where,
         "must hold one value (a 0-d array), has " + std::to_string(count(l.header.shape)));
  }
  return l;
}

}  // namespace

NpyArray read_mask_npy(const std::string& path, const std::string& argument) {
  const Loaded l = load_checked(read_file(path, argument), path, argument, little_integer,
                                "a mask is bool or 0/1 integers");
  NpyArray a{l.header.shape, l.header.descr, {}, {}};
  const size_t n = static_cast<size_t>(a.numel());
  a.flags.resize(n);
  for (size_t i = 0; i < n; ++i) {
    bool nonzero = false;
    for (size_t b = 0; b < l.item; ++b) nonzero = nonzero || l.data()[l.item * i + b] != 0;
    a.flags[l.at(i)] = nonzero ? 1 : 0;
  }
  return a;
}

double decode_float_scalar_npy(std::string bytes, const std::string& where,
                               const std::string& argument) {
  const Loaded l = load_scalar(
      std::move(bytes), where, argument,
      [](const std::string& d) { return d == "<f4" || d == "<f8" || d == "=f4" || d == "=f8"; },
      "use a little-endian float32 or float64 scalar");
  return l.item == 4 ? load<float>(l.data()) : load<double>(l.data());
}

int64_t decode_int_scalar_npy(std::string bytes, const std::string& where,
                              const std::string& argument) {
  const Loaded l = load_scalar(std::move(bytes), where, argument, little_integer,
                               "use a little-endian integer scalar");
  const bool is_signed = l.header.descr[1] == 'i';
  uint64_t bits = 0;
  for (size_t b = 0; b < l.item; ++b)
    bits |= static_cast<uint64_t>(static_cast<unsigned char>(l.data()[b])) << (8 * b);
  if (is_signed && l.item < 8 && (bits >> (8 * l.item - 1)) & 1) bits |= ~0ull << (8 * l.item);
  if (!is_signed && l.item == 8 && bits > static_cast<uint64_t>(INT64_MAX))
    fail(argument, where, "value " + std::to_string(bits) + " does not fit int64");
  return static_cast<int64_t>(bits);
}

std::string decode_unicode_npy(std::string bytes, const std::string& where,
                               const std::string& argument) {
  const Loaded l = load_scalar(
      std::move(bytes), where, argument,
      [](const std::string& d) {
        return d.size() >= 3 && (d[0] == '<' || d[0] == '=') && d[1] == 'U';
      },
      "use a little-endian unicode string ('<U')");
  std::string text;
  for (size_t i = 0; i < l.item / 4; ++i) {
    const auto c = load<uint32_t>(l.data() + 4 * i);
    if (c == 0) break;  // numpy pads with NUL code units
    if (c > 0x7e || c < 0x20) fail(argument, where, "holds a character outside printable ASCII");
    text += static_cast<char>(c);
  }
  return text;
}

std::string encode_npy(const std::string& descr, const std::vector<int64_t>& shape,
                       const void* data, size_t bytes) {
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
  out.append(static_cast<const char*>(data), bytes);
  return out;
}

std::string encode_npy_f32(const std::vector<int64_t>& shape, const float* data) {
  return encode_npy("<f4", shape, data, static_cast<size_t>(count(shape)) * sizeof(float));
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
  std::string temp = path + ".partial-XXXXXX";
  const int fd = mkstemp(temp.data());
  if (fd < 0)
    fail(argument, path, std::string("cannot create output (") + std::strerror(errno) + ")");
  entries_.push_back({temp, path});
  const mode_t mask = ::umask(0);  // mkstemp creates 0600; give the usual 0666 & ~umask
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      ::close(fd);
      fail(argument, path, std::string("write failed (") + std::strerror(errno) + ")");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
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

}  // namespace favor::cli
