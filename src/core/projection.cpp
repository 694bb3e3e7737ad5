// Projection matrices (math.md s.3). Built with EIGEN_DONT_VECTORIZE and
// -ffp-contract=off (see CMakeLists.txt) so the QR runs the same scalar IEEE operations,
// in the same order, on every compiler and machine: W depends on (kind, norms, d, m, seed)
// alone.
#include "favor/projection.hpp"

#include <Eigen/QR>
#include <cmath>
#include <string>

#include "core/rng.hpp"
#include "favor/error.hpp"

namespace favor {
namespace {

// Stream ids: iid rows use stream 0; orthogonal block b uses 2b+1 for its Gaussian matrix
// and 2b+2 for its row norms, so block b is the same whatever m is.
constexpr uint64_t kIidStream = 0;

void check_sizes(int64_t m, int64_t d) {
  if (m < 1) throw Error("m: " + std::to_string(m) + " random features; m must be >= 1");
  if (d < 1) throw Error("d: " + std::to_string(d) + " head dim; d must be >= 1");
  if (m > (int64_t{1} << 24) || d > (int64_t{1} << 16)) {
    throw Error("m x d: " + std::to_string(m) + " x " + std::to_string(d) +
                " exceeds the supported size (m <= 2^24, d <= 2^16)");
  }
}

double chi_norm(detail::Rng& rng, int64_t d) {
  double sum = 0.0;
  for (int64_t i = 0; i < d; ++i) {
    const double g = rng.normal();
    sum += g * g;
  }
  return std::sqrt(sum);
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
  Eigen::MatrixXd g(d, d);
  for (int64_t b = 0; b < blocks; ++b) {
    detail::Rng grng(seed, 2 * static_cast<uint64_t>(b) + 1);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) g(i, j) = grng.normal();
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
    Eigen::MatrixXd q = qr.householderQ();
    const Eigen::MatrixXd& r = qr.matrixQR();
    // Fix the signs so that diag(R) > 0: then Q is Haar-distributed and unique.
    for (int64_t j = 0; j < d; ++j) {
      if (r(j, j) < 0) q.col(j) = -q.col(j);
    }
    detail::Rng nrng(seed, 2 * static_cast<uint64_t>(b) + 2);
    const int64_t rows = std::min(d, m - b * d);
    for (int64_t i = 0; i < rows; ++i) {
      const double norm =
          norms == NormMode::chi ? chi_norm(nrng, d) : std::sqrt(static_cast<double>(d));
      for (int64_t j = 0; j < d; ++j) {
        w[static_cast<size_t>((b * d + i) * d + j)] = static_cast<float>(norm * q(j, i));
      }
    }
  }
  return w;
}

}  // namespace

Projection Projection::draw(int64_t m, int64_t d, const ProjectionOptions& options) {
  check_sizes(m, d);
  if (options.kind == ProjectionKind::iid) {
    if (options.norms != NormMode::chi) {
      throw Error("norms: 'fixed' applies to orthogonal projections only (iid rows are Gaussian)");
    }
    return Projection(m, d, draw_iid(m, d, options.seed), options, false);
  }
  return Projection(m, d, draw_orthogonal(m, d, options.seed, options.norms), options, false);
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
  return kind == ProjectionKind::iid ? "iid" : "orthogonal";
}

std::string to_string(NormMode mode) {
  return mode == NormMode::chi ? "chi" : "fixed";
}

ProjectionKind parse_projection_kind(const std::string& text, const std::string& argument) {
  if (text == "iid") return ProjectionKind::iid;
  if (text == "orthogonal") return ProjectionKind::orthogonal;
  throw Error(argument + ": '" + text + "' is not a projection; use iid or orthogonal");
}

}  // namespace favor
