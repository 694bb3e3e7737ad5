// Projection matrices (math.md s.3, docs/projections.md): validation, dispatch to the kinds,
// import. Built with EIGEN_DONT_VECTORIZE and -ffp-contract=off (see CMakeLists.txt), like
// projection_kinds.cpp, so that W depends on (kind, norms, d, m, seed) alone.
#include "favor/projection.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/projection_kinds.hpp"
#include "core/rng.hpp"
#include "favor/error.hpp"

namespace favor {
namespace {

// Stream ids: iid rows use stream 0; orthogonal block b uses 2b+1 for its Gaussian matrix
// and 2b+2 for its row norms, so block b is the same whatever m is. The other kinds use
// ids >= 2^56 (detail::stream_id).
constexpr uint64_t kIidStream = 0;

void check_sizes(int64_t m, int64_t d) {
  if (m < 1) throw Error("m: " + std::to_string(m) + " random features; m must be >= 1");
  if (d < 1) throw Error("d: " + std::to_string(d) + " head dim; d must be >= 1");
  if (m > (int64_t{1} << 24) || d > (int64_t{1} << 16)) {
    throw Error("m x d: " + std::to_string(m) + " x " + std::to_string(d) +
                " exceeds the supported size (m <= 2^24, d <= 2^16)");
  }
}

// The norm modes each kind takes (the first is the default, chi).
std::string valid_norms(ProjectionKind kind) {
  switch (kind) {
    case ProjectionKind::orthogonal:
    case ProjectionKind::simplex:
    case ProjectionKind::sorf:
      return "chi or fixed";
    case ProjectionKind::radial:
      return "chi (stratified) or quantile";
    case ProjectionKind::dct:
      return "chi (chi(d) norms) or quantile (DiJiang's normal quantiles)";
    default:
      return "chi only";
  }
}

void check_options(int64_t d, const ProjectionOptions& o) {
  const bool ok = o.norms == NormMode::chi ||
                  (o.norms == NormMode::fixed &&
                   (o.kind == ProjectionKind::orthogonal || o.kind == ProjectionKind::simplex ||
                    o.kind == ProjectionKind::sorf)) ||
                  (o.norms == NormMode::quantile &&
                   (o.kind == ProjectionKind::radial || o.kind == ProjectionKind::dct));
  if (!ok) {
    const std::string why = o.norms == NormMode::fixed
                                ? "fixed sqrt(d) norms apply to orthogonal projections only: "
                                  "orthogonal, simplex, sorf"
                                : "quantile norms apply to radial and dct projections only";
    throw Error("norms: '" + to_string(o.norms) + "' is not valid for " + to_string(o.kind) +
                " projections (" + why + "); " + to_string(o.kind) + " takes " +
                valid_norms(o.kind));
  }
  if (o.kind == ProjectionKind::simplex && d < 2) {
    throw Error("d: " + std::to_string(d) +
                " head dim; simplex projections need d >= 2 (a regular simplex of d directions)");
  }
  if (o.kind == ProjectionKind::qmc && d > detail::qmc_max_dimension()) {
    throw Error("d: " + std::to_string(d) + " head dim; qmc projections support d <= " +
                std::to_string(detail::qmc_max_dimension()) +
                " (the Sobol direction numbers of Boost.Random)");
  }
}

std::vector<float> draw_iid(int64_t m, int64_t d, uint64_t seed) {
  detail::Rng rng(seed, kIidStream);
  std::vector<float> w(static_cast<size_t>(m * d));
  for (float& x : w) x = static_cast<float>(rng.normal());
  return w;
}

std::vector<float> draw_orthogonal(int64_t m, int64_t d, uint64_t seed, NormMode norms) {
  std::vector<float> w(static_cast<size_t>(m * d));
  const int64_t blocks = (m + d - 1) / d;
  for (int64_t b = 0; b < blocks; ++b) {
    const std::vector<double> dir =
        detail::haar_directions(seed, 2 * static_cast<uint64_t>(b) + 1, d);
    detail::Rng nrng(seed, 2 * static_cast<uint64_t>(b) + 2);
    const int64_t rows = std::min(d, m - b * d);
    for (int64_t i = 0; i < rows; ++i) {
      const double norm =
          norms == NormMode::chi ? detail::chi_norm(nrng, d) : std::sqrt(static_cast<double>(d));
      for (int64_t j = 0; j < d; ++j) {
        w[static_cast<size_t>((b * d + i) * d + j)] =
            static_cast<float>(norm * dir[static_cast<size_t>(i * d + j)]);
      }
    }
  }
  return w;
}

std::vector<float> draw_matrix(int64_t m, int64_t d, const ProjectionOptions& o) {
  switch (o.kind) {
    case ProjectionKind::iid:
      return draw_iid(m, d, o.seed);
    case ProjectionKind::orthogonal:
      return draw_orthogonal(m, d, o.seed, o.norms);
    case ProjectionKind::radial:
      return detail::draw_radial(m, d, o.seed, o.norms);
    case ProjectionKind::qmc:
      return detail::draw_qmc(m, d, o.seed);
    case ProjectionKind::sorf:
      return detail::draw_sorf(m, d, o.seed, o.norms);
    case ProjectionKind::simplex:
      return detail::draw_simplex(m, d, o.seed, o.norms);
    case ProjectionKind::dct:
      return detail::draw_dct(m, d, o.seed, o.norms);
  }
  throw Error("kind: " + std::to_string(static_cast<int>(o.kind)) + " is not a projection kind");
}

}  // namespace

Projection Projection::draw(int64_t m, int64_t d, const ProjectionOptions& options) {
  check_sizes(m, d);
  check_options(d, options);
  return Projection(m, d, draw_matrix(m, d, options), options, false);
}

Projection Projection::from_matrix(int64_t m, int64_t d, std::vector<float> values) {
  check_sizes(m, d);
  if (static_cast<int64_t>(values.size()) != m * d) {
    throw Error("projection matrix: " + std::to_string(values.size()) +
                " values; an m x d = " + std::to_string(m) + " x " + std::to_string(d) +
                " matrix needs " + std::to_string(m * d));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      throw Error("projection matrix: element [" + std::to_string(i / static_cast<size_t>(d)) +
                  ',' + std::to_string(i % static_cast<size_t>(d)) + "] is not finite");
    }
  }
  return Projection(m, d, std::move(values), ProjectionOptions{}, true);
}

Projection Projection::redraw(uint64_t seed) const {
  if (imported_) throw Error("redraw: an imported projection matrix cannot be redrawn");
  ProjectionOptions o = options_;
  o.seed = seed;
  return draw(m_, d_, o);
}

std::string to_string(ProjectionKind kind) {
  switch (kind) {
    case ProjectionKind::iid:
      return "iid";
    case ProjectionKind::orthogonal:
      return "orthogonal";
    case ProjectionKind::radial:
      return "radial";
    case ProjectionKind::qmc:
      return "qmc";
    case ProjectionKind::sorf:
      return "sorf";
    case ProjectionKind::simplex:
      return "simplex";
    case ProjectionKind::dct:
      return "dct";
  }
  return "unknown";
}

std::string to_string(NormMode mode) {
  switch (mode) {
    case NormMode::chi:
      return "chi";
    case NormMode::fixed:
      return "fixed";
    case NormMode::quantile:
      return "quantile";
  }
  return "unknown";
}

ProjectionKind parse_projection_kind(const std::string& text, const std::string& argument) {
  for (ProjectionKind kind :
       {ProjectionKind::iid, ProjectionKind::orthogonal, ProjectionKind::radial,
        ProjectionKind::qmc, ProjectionKind::sorf, ProjectionKind::simplex, ProjectionKind::dct}) {
    if (text == to_string(kind)) return kind;
  }
  throw Error(argument + ": '" + text +
              "' is not a projection; use iid, orthogonal, radial, qmc, sorf, simplex or dct");
}

NormMode parse_norm_mode(const std::string& text, const std::string& argument) {
  for (NormMode mode : {NormMode::chi, NormMode::fixed, NormMode::quantile}) {
    if (text == to_string(mode)) return mode;
  }
  throw Error(argument + ": '" + text + "' is not a norm mode; use chi, fixed or quantile");
}

}  // namespace favor
