#include "map_file.hpp"

#include <cmath>
#include <map>
#include <optional>

#include "npy.hpp"
#include "npz.hpp"

namespace favor::io {
namespace {

constexpr size_t kKernelWidth = 16;  // '<U16'

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

class MapReader {
 public:
  MapReader(const std::string& bytes, const std::string& path, const std::string& argument)
      : path_(path), argument_(argument), members_(decode_npz(bytes, path, argument)) {}

  [[noreturn]] void fail(const std::string& rule) const {
    throw Error(argument_ + ": " + path_ + ": " + rule);
  }
  bool has(const std::string& name) const { return members_.count(name) != 0; }
  const std::string& member(const std::string& name) const {
    const auto it = members_.find(name);
    if (it == members_.end()) fail("no member '" + name + "' (not a favor feature-map file?)");
    return it->second;
  }
  std::string where(const std::string& name) const { return path_ + " member '" + name + "'"; }
  std::string text(const std::string& name) const {
    return decode_unicode_npy(member(name), where(name), argument_);
  }
  double number(const std::string& name) const {
    return decode_float_scalar_npy(member(name), where(name), argument_);
  }
  int64_t integer(const std::string& name) const {
    return decode_int_scalar_npy(member(name), where(name), argument_);
  }
  std::vector<float> array(const std::string& name, const std::vector<int64_t>& shape,
                           const char* layout) const {
    NpyArray a = decode_float_npy(member(name), where(name), argument_);
    if (a.shape != shape) {
      fail("member '" + name + "' has shape " + shape_text(a.shape) + "; " + layout + " = " +
           shape_text(shape) + " expected");
    }
    return std::move(a.values);
  }
  NpyArray projection() const {
    NpyArray a = decode_float_npy(member("projection"), where("projection"), argument_);
    if (a.shape.size() != 2)
      fail("member 'projection' must be 2-D [m, d], has shape " + shape_text(a.shape));
    return a;
  }

 private:
  const std::string &path_, &argument_;
  std::map<std::string, std::string> members_;
};

}  // namespace

std::string encode_map_file(const FeatureMap& map) {
  if (data_adapted(map.kernel)) {
    throw Error("map: a " + to_string(map.kernel) +
                " map is defined by its fit, which the map file does not hold");
  }
  const int64_t m = map.m(), d = map.d();
  const double scale = map.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  std::vector<NpzMember> members{
      {"kernel", encode_npy_unicode(to_string(map.kernel), kKernelWidth)},
      {"scale", encode_npy_f64_scalar(scale)},
      {"projection", encode_npy_f32({m, d}, map.projection.data())},
      {"heads", encode_npy_i64_scalar(map.heads)}};
  if (!map.weights.empty())
    members.push_back({"weights", encode_npy_f32({map.heads, m, d}, map.weights.data())});
  if (!map.bias.empty())
    members.push_back({"bias", encode_npy_f32({map.heads, m}, map.bias.data())});
  if (!map.lambda.empty())
    members.push_back({"lambda", encode_npy_f32({map.heads, m}, map.lambda.data())});
  return encode_npz(members);
}

FeatureMap read_map_file(const std::string& path, const std::string& argument) {
  return decode_map_file(read_file(path, argument), path, argument);
}

FeatureMap decode_map_file(const std::string& bytes, const std::string& path,
                           const std::string& argument) {
  const MapReader r(bytes, path, argument);
  const std::string kernel_name = r.text("kernel");
  Kernel kernel;
  try {
    kernel = parse_kernel(kernel_name, "kernel");
  } catch (const Error&) {
    r.fail("member 'kernel' is '" + kernel_name +
           "'; hedgehog, positive, trig or hyperbolic expected");
  }
  if (data_adapted(kernel))
    r.fail("kernel " + kernel_name + " needs its fit, which a map file does not hold");
  const double scale = r.number("scale");
  if (!(std::isfinite(scale) && scale > 0.0))
    r.fail("member 'scale' is " + std::to_string(scale) + "; must be finite and > 0");
  NpyArray w = r.projection();
  const int64_t m = w.shape[0], d = w.shape[1], heads = r.integer("heads");
  if (heads < 1) r.fail("member 'heads' is " + std::to_string(heads) + "; must be >= 1");
  std::optional<Projection> projection;
  try {
    projection = Projection::from_matrix(m, d, std::move(w.values));
  } catch (const Error& e) {
    r.fail(std::string("member 'projection': ") + e.what());
  }
  FeatureMap map(std::move(*projection), kernel);
  map.scale = scale;
  map.heads = heads;
  if (r.has("weights")) map.weights = r.array("weights", {heads, m, d}, "[heads, m, d]");
  if (r.has("bias")) map.bias = r.array("bias", {heads, m}, "[heads, m]");
  if (r.has("lambda")) map.lambda = r.array("lambda", {heads, m}, "[heads, m]");
  try {
    check_feature_map(map, d, heads, heads, "map");
  } catch (const Error& e) {
    r.fail(e.what());
  }
  return map;
}

std::vector<float> read_feature_weights(const std::string& path, const std::string& argument,
                                        int64_t m, int64_t heads, int64_t& sets) {
  NpyArray a = read_float_npy(path, argument);
  if (a.shape == std::vector<int64_t>{m}) {
    sets = 1;
  } else if (a.shape == std::vector<int64_t>{heads, m}) {
    sets = heads;
  } else {
    throw Error(argument + ": " + path + ": has shape " + shape_text(a.shape) + "; [m] = [" +
                std::to_string(m) + "] or [H, m] = [" + std::to_string(heads) + ", " +
                std::to_string(m) + "] expected (one weight per projection row)");
  }
  for (size_t i = 0; i < a.values.size(); ++i) {
    if (!std::isfinite(a.values[i]) || a.values[i] == 0.0f) {
      throw Error(argument + ": " + path + ": weight " + std::to_string(i) + " is " +
                  std::to_string(a.values[i]) + "; feature weights must be finite and nonzero");
    }
  }
  return std::move(a.values);
}

}  // namespace favor::io
