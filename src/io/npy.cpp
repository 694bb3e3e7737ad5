// Reading .npy arrays: dtype checks, the data-size check and the one-pass conversion to
// float32 (or mask flags) in C order. The header is parsed in npy_header.cpp, files are
// written in npy_write.cpp.
#include "npy.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "favor/error.hpp"
#include "favor/runtime.hpp"
#include "printable.hpp"

namespace favor::io {
namespace {

[[noreturn]] void fail(const std::string& argument, const std::string& where,
                       const std::string& rule) {
  throw Error(argument + ": " + where + ": " + rule);
}

// Whether data in byte order `order` ('<', '>', '=' or '|') must be swapped on this host.
bool swapped(char order) {
  constexpr bool little = std::endian::native == std::endian::little;
  return order == '>' ? little : order == '<' ? !little : false;
}

template <class T>
T load(const char* p, bool swap) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, p, sizeof(T));
  if (swap) {
    for (size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(b[i], b[sizeof(T) - 1 - i]);
  }
  T v;
  std::memcpy(&v, b, sizeof(T));
  return v;
}

// IEEE binary16 to float, exactly (subnormals, Inf and NaN included).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {  // subnormal: value mantissa * 2^-24, exact in float
    const float v = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -v : v;
  } else {
    bits = sign;
  }
  return std::bit_cast<float>(bits);
}

bool float_dtype(const std::string& d) {
  return d.size() == 3 && (d[0] == '<' || d[0] == '>' || d[0] == '=') && d[1] == 'f' &&
         (d[2] == '2' || d[2] == '4' || d[2] == '8');
}

bool integer_dtype(const std::string& d) {
  if (d == "|b1" || d == "|u1" || d == "|i1") return true;
  return d.size() == 3 && (d[0] == '<' || d[0] == '>' || d[0] == '=') &&
         (d[1] == 'i' || d[1] == 'u') && (d[2] == '2' || d[2] == '4' || d[2] == '8');
}

constexpr const char* kFloatRule = "use float16, float32 or float64 (either byte order)";
constexpr const char* kMaskRule = "a mask is bool or 0/1 integers";

// Checks the dtype, a non-empty shape and that `bytes` hold all the data the header announces;
// returns where the data begins.
const char* checked_data(const NpyHeader& h, std::string_view bytes,
                         bool (*accept)(const std::string&), const char* rule,
                         const std::string& where, const std::string& argument) {
  if (!accept(h.descr)) {
    fail(argument, where, "dtype '" + printable(h.descr) + "' is not supported; " + rule);
  }
  if (h.numel() == 0) fail(argument, where, "array has no elements");
  const uint64_t need = static_cast<uint64_t>(h.numel()) * h.item;
  const uint64_t have = bytes.size() - h.data_offset;
  if (have < need) {
    fail(argument, where,
         "truncated: " + std::to_string(need) + " bytes of data expected, " + std::to_string(have) +
             " found");
  }
  return bytes.data() + h.data_offset;
}

// dst[c] = convert(element at C-order position c) for every element, in one pass over the
// output; a Fortran-order file is read with the transposed strides.
template <class Out, class Convert>
void convert_all(const NpyHeader& h, const char* src, Out* dst, Convert convert) {
  const size_t n = static_cast<size_t>(h.numel()), item = h.item, rank = h.shape.size();
  if (!h.fortran || rank <= 1) {
    // Large arrays are converted by favor's threads, in blocks of 64 Ki elements.
    const auto blocks = static_cast<int64_t>((n + 65535) / 65536);
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (blocks > 8)
    for (int64_t b = 0; b < blocks; ++b) {
      const size_t end = std::min(n, static_cast<size_t>(b + 1) * 65536);
      for (size_t i = static_cast<size_t>(b) * 65536; i < end; ++i)
        dst[i] = convert(src + i * item);
    }
    return;
  }
  std::vector<size_t> stride(rank), idx(rank, 0);
  size_t s = 1;
  for (size_t a = 0; a < rank; ++a) {  // Fortran order: the first axis is fastest
    stride[a] = s;
    s *= static_cast<size_t>(h.shape[a]);
  }
  const size_t inner = static_cast<size_t>(h.shape[rank - 1]), inner_stride = stride[rank - 1];
  for (size_t out = 0;;) {
    size_t base = 0;
    for (size_t a = 0; a + 1 < rank; ++a) base += idx[a] * stride[a];
    for (size_t j = 0; j < inner; ++j) dst[out++] = convert(src + (base + j * inner_stride) * item);
    size_t a = rank - 1;
    while (a > 0) {
      --a;
      if (++idx[a] < static_cast<size_t>(h.shape[a])) break;
      idx[a] = 0;
      if (a == 0) return;
    }
  }
}

void convert_floats(const NpyHeader& h, const char* src, float* dst) {
  const bool swap = swapped(h.descr[0]);
  if (h.item == 2) {
    convert_all(h, src, dst,
                [swap](const char* p) { return half_to_float(load<uint16_t>(p, swap)); });
  } else if (h.item == 4) {
    convert_all(h, src, dst, [swap](const char* p) { return load<float>(p, swap); });
  } else {
    convert_all(h, src, dst,
                [swap](const char* p) { return static_cast<float>(load<double>(p, swap)); });
  }
}

// The header and data of .npy bytes whose dtype `accept` takes.
struct Checked {
  NpyHeader header;
  const char* data;
};
Checked check(std::string_view bytes, bool (*accept)(const std::string&), const char* rule,
              const std::string& where, const std::string& argument) {
  if (bytes.empty()) fail(argument, where, "empty, not a .npy array");
  NpyHeader h = parse_npy_header(bytes, where, argument);
  const char* data = checked_data(h, bytes, accept, rule, where, argument);
  return {std::move(h), data};
}

Checked check_scalar(std::string_view bytes, bool (*accept)(const std::string&), const char* rule,
                     const std::string& where, const std::string& argument) {
  Checked c = check(bytes, accept, rule, where, argument);
  if (c.header.numel() != 1) {
    fail(argument, where,
         "must hold one value (a 0-d array), has " + std::to_string(c.header.numel()));
  }
  return c;
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

FloatNpy map_float_npy(const std::string& path, const std::string& argument) {
  auto file = std::make_shared<const MappedFile>(path, argument);
  const Checked c = check(file->bytes(), float_dtype, kFloatRule, path, argument);
  FloatNpy out;
  out.header = c.header;
  const bool native_f32 = c.header.item == 4 && !swapped(c.header.descr[0]);
  const bool c_order = !c.header.fortran || c.header.shape.size() <= 1;
  if (native_f32 && c_order && reinterpret_cast<uintptr_t>(c.data) % alignof(float) == 0) {
    out.data = reinterpret_cast<const float*>(c.data);
    out.storage = std::move(file);
    out.in_place = true;
    return out;
  }
  auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(c.header.numel()));
  convert_floats(c.header, c.data, values->data());
  out.data = values->data();
  out.storage = std::move(values);  // the mapping is released here
  return out;
}

NpyArray read_float_npy(const std::string& path, const std::string& argument) {
  const FloatNpy f = map_float_npy(path, argument);
  return {f.header.shape, f.header.descr, std::vector<float>(f.data, f.data + f.numel()), {}};
}

NpyArray decode_float_npy(std::string_view bytes, const std::string& where,
                          const std::string& argument) {
  const Checked c = check(bytes, float_dtype, kFloatRule, where, argument);
  NpyArray a{c.header.shape, c.header.descr, {}, {}};
  a.values.resize(static_cast<size_t>(c.header.numel()));
  convert_floats(c.header, c.data, a.values.data());
  return a;
}

NpyArray read_mask_npy(const std::string& path, const std::string& argument) {
  const MappedFile file(path, argument);
  const Checked c = check(file.bytes(), integer_dtype, kMaskRule, path, argument);
  NpyArray a{c.header.shape, c.header.descr, {}, {}};
  a.flags.resize(static_cast<size_t>(c.header.numel()));
  const size_t item = c.header.item;
  // Nonzero in any byte order is nonzero in some byte: no swap needed.
  convert_all(c.header, c.data, a.flags.data(), [item](const char* p) {
    bool nonzero = false;
    for (size_t b = 0; b < item; ++b) nonzero = nonzero || p[b] != 0;
    return static_cast<uint8_t>(nonzero);
  });
  return a;
}

std::string read_file(const std::string& path, const std::string& argument) {
  const MappedFile file(path, argument);
  return std::string(file.bytes());
}

double decode_float_scalar_npy(std::string_view bytes, const std::string& where,
                               const std::string& argument) {
  const Checked c =
      check_scalar(bytes, float_dtype, "use a float16, float32 or float64 scalar", where, argument);
  const bool swap = swapped(c.header.descr[0]);
  if (c.header.item == 2) return half_to_float(load<uint16_t>(c.data, swap));
  return c.header.item == 4 ? load<float>(c.data, swap) : load<double>(c.data, swap);
}

int64_t decode_int_scalar_npy(std::string_view bytes, const std::string& where,
                              const std::string& argument) {
  const Checked c = check_scalar(bytes, integer_dtype, "use an integer scalar", where, argument);
  const size_t item = c.header.item;
  const bool is_signed = c.header.descr[1] == 'i', swap = swapped(c.header.descr[0]);
  uint64_t bits = 0;
  for (size_t b = 0; b < item; ++b) {
    const size_t from = swap ? item - 1 - b : b;  // b-th least significant byte
    bits |= static_cast<uint64_t>(static_cast<unsigned char>(c.data[from])) << (8 * b);
  }
  if (is_signed && item < 8 && (bits >> (8 * item - 1)) & 1) bits |= ~0ull << (8 * item);
  if (!is_signed && item == 8 && bits > static_cast<uint64_t>(INT64_MAX))
    fail(argument, where, "value " + std::to_string(bits) + " does not fit int64");
  return static_cast<int64_t>(bits);
}

std::string decode_unicode_npy(std::string_view bytes, const std::string& where,
                               const std::string& argument) {
  const Checked c = check_scalar(
      bytes,
      [](const std::string& d) {
        return d.size() >= 3 && (d[0] == '<' || d[0] == '=') && d[1] == 'U';
      },
      "use a little-endian unicode string ('<U')", where, argument);
  std::string text;
  for (size_t i = 0; i < c.header.item / 4; ++i) {
    const auto u = load<uint32_t>(c.data + 4 * i, swapped(c.header.descr[0]));
    if (u == 0) break;  // numpy pads with NUL code units
    if (u > 0x7e || u < 0x20) fail(argument, where, "holds a character outside printable ASCII");
    text += static_cast<char>(u);
  }
  return text;
}

}  // namespace favor::io
