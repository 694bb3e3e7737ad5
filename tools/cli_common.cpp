#include "cli_common.hpp"

namespace favor::cli {

void add_projection_options(CLI::App* app, ProjectionArgs& a) {
  a.features_opt = app->add_option("--features", a.features,
                                   "number of random projections m (F = m or 2m features)")
                       ->capture_default_str();
  a.kind_opt = app->add_option("--projection", a.kind,
                               "iid | orthogonal | radial | qmc | sorf | simplex | dct "
                               "(docs/projections.md)")
                   ->capture_default_str();
  a.norms_opt =
      app->add_option("--norms", a.norms,
                      "chi (unbiased; stratified for radial) | fixed (sqrt(d) row norms: the "
                      "regularised kernel SMREG; orthogonal, simplex, sorf as constructed) | "
                      "quantile (radial: deterministic chi(d) quantiles; dct: DiJiang's "
                      "normal quantiles; biased)")
          ->capture_default_str();
  a.seed_opt =
      app->add_option("--seed", a.seed,
                      "64-bit seed of the projection (attention --method vq: of the k-means)")
          ->capture_default_str();
  auto* file = app->add_option("--projection-file", a.file,
                               "load W (an [m, D] .npy array) instead of drawing it");
  file->excludes(a.features_opt)->excludes(a.kind_opt)->excludes(a.norms_opt)->excludes(a.seed_opt);
  app->add_option("--save-projection", a.save, "also write the W used, as an [m, D] float32 .npy");
}

Projection make_projection(const ProjectionArgs& a, int64_t d) {
  if (!a.file.empty()) {
    NpyArray w = read_float_npy(a.file, "--projection-file");
    if (w.shape.size() != 2) {
      throw Error("--projection-file: " + a.file + ": must be a 2-D [m, D] array, has rank " +
                  std::to_string(w.shape.size()));
    }
    if (w.shape[1] != d) {
      throw Error("--projection-file: " + a.file + ": has D = " + std::to_string(w.shape[1]) +
                  ", the inputs have D = " + std::to_string(d));
    }
    return Projection::from_matrix(w.shape[0], w.shape[1], std::move(w.values));
  }
  ProjectionOptions o;
  o.kind = parse_projection_kind(a.kind, "--projection");
  o.norms = parse_norm_mode(a.norms, "--norms");
  o.seed = a.seed;
  if (a.features < 1) throw Error("--features: " + std::to_string(a.features) + " must be >= 1");
  return Projection::draw(a.features, d, o);
}

InputTensor read_tensor(const std::string& path, const std::string& argument) {
  FloatNpy a = map_float_npy(path, argument);
  InputTensor t;
  const auto& s = a.shape();
  t.rank = s.size();
  Shape4 shape;
  if (t.rank == 2) {
    shape = {1, 1, s[0], s[1]};
  } else if (t.rank == 4) {
    shape = {s[0], s[1], s[2], s[3]};
  } else {
    throw Error(argument + ": " + path + ": must be 2-D [N, D] or 4-D [B, H, N, D], has rank " +
                std::to_string(t.rank));
  }
  t.tensor = TensorView::contiguous(a.data, shape);
  t.storage = std::move(a.storage);
  return t;
}

Tensor InputTensor::copy() const {
  return Tensor(tensor.shape, std::vector<float>(tensor.data, tensor.data + tensor.numel()));
}

std::vector<uint8_t> read_mask(const std::string& path, size_t input_rank, int64_t batch,
                               int64_t nk) {
  NpyArray m = read_mask_npy(path, "--key-mask");
  const std::vector<int64_t> expected =
      input_rank == 2 ? std::vector<int64_t>{nk} : std::vector<int64_t>{batch, nk};
  if (m.shape != expected) {
    std::string want =
        input_rank == 2 ? "[Nk] = [" + std::to_string(nk) + "]"
                        : "[B, Nk] = [" + std::to_string(batch) + ", " + std::to_string(nk) + "]";
    throw Error("--key-mask: " + path + ": must have shape " + want);
  }
  return std::move(m.flags);
}

namespace {

std::vector<int64_t> file_shape(const Shape4& s, size_t rank) {
  return rank == 2 ? std::vector<int64_t>{s[2], s[3]}
                   : std::vector<int64_t>{s[0], s[1], s[2], s[3]};
}

}  // namespace

std::string encode_tensor(const Tensor& t, size_t rank) {
  return encode_npy_f32(file_shape(t.shape(), rank), t.data());
}

void stage_tensor(StagedOutputs& outputs, const std::string& path, const Tensor& t, size_t rank,
                  const std::string& argument) {
  outputs.stage_f32(path, file_shape(t.shape(), rank), t.data(), argument);
}

}  // namespace favor::cli
