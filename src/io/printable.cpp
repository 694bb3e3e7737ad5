#include "printable.hpp"

namespace favor::io {
namespace {

void escape(std::string& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 15];
}

// Length of the valid UTF-8 sequence of 2-4 bytes at `at` (no overlongs, no surrogates, at
// most U+10FFFF), or 0.
size_t utf8_length(std::string_view s, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = byte(at);
  size_t n = 0;
  unsigned char low = 0x80, high = 0xbf;  // range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) low = 0xa0;
    if (c == 0xed) high = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) low = 0x90;
    if (c == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (at + n > s.size()) return 0;
  if (byte(at + 1) < low || byte(at + 1) > high) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (byte(at + i) < 0x80 || byte(at + i) > 0xbf) return 0;
  }
  return n;
}

}  // namespace

std::string printable(std::string_view text, size_t max_bytes) {
  std::string out;
  const size_t n = text.size() < max_bytes ? text.size() : max_bytes;
  out.reserve(n + 8);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      escape(out, c);
    }
  }
  if (n < text.size()) out += "...";
  return out;
}

std::string terminal_safe(std::string_view message) {
  std::string out;
  out.reserve(message.size());
  for (size_t i = 0; i < message.size();) {
    const auto c = static_cast<unsigned char>(message[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
    } else if (const size_t n = c >= 0x80 ? utf8_length(message, i) : 0; n > 0) {
      out.append(message.substr(i, n));
      i += n;
    } else {
      escape(out, c);
      ++i;
    }
  }
  return out;
}

}  // namespace favor::io
