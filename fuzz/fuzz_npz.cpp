// Fuzz target: the loaders of the CLI's archives and arrays. The input is one file:
//  - an .npz (it starts with "PK"): decode_npz, decode_map_file (a fitted feature map, and a
//    map that decodes must encode and decode to the same map), and every member through the
//    loaders below;
//  - any file (the input, or each member): the loaders that take a path (read_codebook,
//    read_feature_weights, make_projection --projection-file, read_tensor, read_mask), on a
//    per-process scratch file, one loader per input, with sizes that match the array (so the
//    checks after decoding run) or not: the file's last byte chooses both.
// Each must return or throw favor::Error with a printable message; a crash, leak, UB, an
// unescaped byte in a message or another exception is a finding.
#include <cmath>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "cli_common.hpp"
#include "favor/favor.hpp"
#include "fuzz_support.hpp"
#include "map_file.hpp"
#include "npy.hpp"
#include "npz.hpp"
#include "vq_args.hpp"

namespace {

using favor::fuzz::unexpected_exception;

template <class F>
void expect_error_or_value(F&& load) {
  try {
    load();
  } catch (const favor::Error& e) {
    favor::fuzz::require_printable("fuzz_npz", e.what());
  } catch (const std::exception& e) {
    unexpected_exception("fuzz_npz", e.what());
  }
}

bool same_map(const favor::FeatureMap& a, const favor::FeatureMap& b) {
  return a.kernel == b.kernel && a.scale == b.scale && a.heads == b.heads && a.m() == b.m() &&
         a.d() == b.d() &&
         std::equal(a.projection.data(), a.projection.data() + a.m() * a.d(),
                    b.projection.data()) &&
         a.weights == b.weights && a.bias == b.bias && a.lambda == b.lambda;
}

void load_map(const std::string& bytes) {
  std::optional<favor::FeatureMap> map;
  expect_error_or_value(
      [&] { map = favor::io::decode_map_file(bytes, "fuzz.npz", "--feature-map"); });
  if (!map) return;
  // A map that loads is valid: it encodes, and reads back unchanged.
  try {
    const favor::FeatureMap again = favor::io::decode_map_file(favor::io::encode_map_file(*map),
                                                                "again.npz", "--feature-map");
    if (!same_map(*map, again)) unexpected_exception("fuzz_npz", "map changed in a round trip");
  } catch (const std::exception& e) {
    unexpected_exception("fuzz_npz",
                         (std::string("a loaded map failed its round trip: ") + e.what()).c_str());
  }
}

/// One of the path loaders (pick % 5) on `bytes`; pick / 5 chooses sizes that match the
/// array or off-by-one ones. (One loader per input: each reads the file, which is slow.)
void load_paths(const std::string& bytes, uint8_t pick) {
  const int loader = pick % 5;
  pick /= 5;
  std::vector<int64_t> shape;  // of the array, when it decodes
  try {
    shape = favor::io::decode_float_npy(bytes, "fuzz.npy", "--q").shape;
  } catch (const std::exception&) {
  }
  const int64_t off = (pick & 1) ? 1 : 0;
  const auto dim = [&](size_t from_end) {
    return shape.size() > from_end ? shape[shape.size() - 1 - from_end] + off : 2 + off;
  };
  const std::string path = favor::fuzz::write_scratch("input.npy", bytes);
  if (loader == 0)
    expect_error_or_value([&] {
      const std::optional<int64_t> codes =
          (pick & 2) ? std::optional<int64_t>(dim(1)) : std::nullopt;
      favor::cli::read_codebook(path, shape.size() == 3 ? shape[0] : 1, dim(0), codes);
    });
  if (loader == 1)
    expect_error_or_value([&] {
      int64_t sets = 0;
      favor::io::read_feature_weights(path, "--feature-weights", dim(0),
                                       shape.size() == 2 ? shape[0] : 1, sets);
    });
  if (loader == 2)
    expect_error_or_value([&] {
      favor::cli::ProjectionArgs args;
      args.file = path;
      favor::cli::make_projection(args, dim(0));
    });
  if (loader == 3) expect_error_or_value([&] { favor::cli::read_tensor(path, "--q"); });
  if (loader == 4)
    expect_error_or_value([&] {
      const size_t rank = (pick & 4) ? 2 : 4;
      favor::cli::read_mask(path, rank, shape.size() == 2 ? shape[0] : 1, dim(0));
    });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const uint8_t pick = size ? data[size - 1] : 0;
  if (bytes.rfind("PK", 0) == 0) {
    std::map<std::string, std::string> members;
    expect_error_or_value(
        [&] { members = favor::io::decode_npz(bytes, "fuzz.npz", "--feature-map"); });
    load_map(bytes);
    for (const auto& [name, member] : members) load_paths(member, pick);
  } else {
    load_paths(bytes, pick);
  }
  return 0;
}
