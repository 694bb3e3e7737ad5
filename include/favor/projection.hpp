#pragma once
/// \file projection.hpp
/// Random projection matrices W (m x d): the w_i of phi_w(x). See docs/projections.md.
#include <cstdint>
#include <string>
#include <vector>

namespace favor {

/// How the rows of W are drawn.
enum class ProjectionKind {
  iid,         ///< rows w_i ~ N(0, I_d)
  orthogonal,  ///< ceil(m/d) blocks, each the Q of a d x d Gaussian QR (default)
};

/// Row norms of orthogonal projections.
enum class NormMode {
  chi,    ///< independent chi(d) norms: every row is marginally N(0, I); unbiased (default)
  fixed,  ///< every row has norm sqrt(d): estimates the regularised kernel SMREG, not SM
};

struct ProjectionOptions {
  ProjectionKind kind = ProjectionKind::orthogonal;
  NormMode norms = NormMode::chi;
  uint64_t seed = 0;
};

/// An m x d projection matrix, row-major. Drawn projections are a function of
/// (kind, norms, d, m, seed) alone: the same bits on every compiler and run.
class Projection {
 public:
  /// Draws W. Throws favor::Error if m < 1 or d < 1.
  static Projection draw(int64_t m, int64_t d, const ProjectionOptions& options = {});
  /// Wraps a user matrix (e.g. from a trained model). values: m*d floats, row-major, finite.
  static Projection from_matrix(int64_t m, int64_t d, std::vector<float> values);

  /// The same kind, norms, m and d, drawn again with another seed.
  Projection redraw(uint64_t seed) const;

  int64_t m() const { return m_; }
  int64_t d() const { return d_; }
  const std::vector<float>& matrix() const { return w_; }
  const float* data() const { return w_.data(); }
  float at(int64_t i, int64_t j) const { return w_[static_cast<size_t>(i * d_ + j)]; }
  /// True for matrices that came from from_matrix (redraw then throws).
  bool imported() const { return imported_; }
  const ProjectionOptions& options() const { return options_; }

 private:
  Projection(int64_t m, int64_t d, std::vector<float> w, ProjectionOptions o, bool imported)
      : m_(m), d_(d), w_(std::move(w)), options_(o), imported_(imported) {}
  int64_t m_ = 0;
  int64_t d_ = 0;
  std::vector<float> w_;
  ProjectionOptions options_{};
  bool imported_ = false;
};

std::string to_string(ProjectionKind kind);
std::string to_string(NormMode mode);
/// Parses "iid" / "orthogonal"; throws favor::Error naming `argument` otherwise.
ProjectionKind parse_projection_kind(const std::string& text, const std::string& argument);

}  // namespace favor
