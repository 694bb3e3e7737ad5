// Fuzz target: the .npy decoders of the CLI (src/io/npy.hpp) on arbitrary bytes: headers,
// dtypes, byte orders, Fortran order, shapes and truncation. Every input must either decode
// or throw favor::Error whose message is printable ASCII (quoted bytes escaped); a crash, leak,
// UB, an unescaped byte or any other exception is a finding.
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>

#include "favor/error.hpp"
#include "fuzz_support.hpp"
#include "npy.hpp"

namespace {

void check_decoded(const favor::io::NpyArray& a) {
  int64_t numel = 1;
  for (const int64_t s : a.shape) {
    if (s < 0) favor::fuzz::unexpected_exception("fuzz_npy", "a negative dimension decoded");
    numel *= s;
  }
  if (static_cast<size_t>(numel) != a.values.size())
    favor::fuzz::unexpected_exception("fuzz_npy", "values do not match the shape");
}

template <class F>
void expect_error_or_value(F&& decode) {
  try {
    decode();
  } catch (const favor::Error& e) {
    favor::fuzz::require_printable("fuzz_npy", e.what());
  } catch (const std::exception& e) {
    favor::fuzz::unexpected_exception("fuzz_npy", e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  expect_error_or_value(
      [&] { check_decoded(favor::io::decode_float_npy(bytes, "fuzz.npy", "--q")); });
  expect_error_or_value([&] { favor::io::decode_float_scalar_npy(bytes, "fuzz.npy", "scale"); });
  expect_error_or_value([&] { favor::io::decode_int_scalar_npy(bytes, "fuzz.npy", "heads"); });
  expect_error_or_value([&] {
    const std::string text = favor::io::decode_unicode_npy(bytes, "fuzz.npy", "kernel");
    for (const char c : text)
      if (c < 0x20 || c > 0x7e)
        favor::fuzz::unexpected_exception("fuzz_npy",
                                          "decode_unicode_npy returned unprintable text");
  });
  return 0;
}
