#pragma once
// Text from files and command lines made safe to print: messages that quote a header, a
// member name or a value pass it through printable(), so a mutated file cannot write control
// sequences to the terminal.
#include <cstddef>
#include <string>
#include <string_view>

namespace favor::io {

/// `text` with every byte outside printable ASCII written as \xNN (backslash as \\), cut
/// after `max_bytes` input bytes with "..." appended.
std::string printable(std::string_view text, size_t max_bytes = 64);

/// A whole message for the terminal: control bytes and invalid UTF-8 escaped as \xNN, valid
/// UTF-8 (paths with accents) kept as it is.
std::string terminal_safe(std::string_view message);

}  // namespace favor::io
