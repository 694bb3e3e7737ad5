#pragma once
/// \file error.hpp
/// The one exception type favor throws for bad input.
#include <stdexcept>
#include <string>

namespace favor {

/// Thrown at the API boundary when an argument breaks a rule. The message names the
/// argument, its value and the rule, e.g. "q: shape [2,4,8,64] and k: shape [2,4,8,32]
/// must have the same head dim D". Derives from std::invalid_argument so that bindings
/// (pybind11) map it to ValueError.
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& what) : std::invalid_argument(what) {}
};

}  // namespace favor
