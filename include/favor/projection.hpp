#pragma once
/// \file projection.hpp
/// Random projection matrices W (m x d): the w_i of phi_w(x). See docs/projections.md.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace favor {

/// How the rows of W are drawn (docs/projections.md has one section per kind).
enum class ProjectionKind {
  iid,         ///< rows w_i ~ N(0, I_d)
  orthogonal,  ///< ceil(m/d) blocks, each the Q of a d x d Gaussian QR (default)
  radial,      ///< orthogonal directions; norms F^-1((i-1+u_i)/m) of chi(d), stratified
               ///< (unbiased) or, with NormMode::quantile, F^-1(i/(m+1)) (seed 004, biased);
               ///< handed to the rows in random order
  qmc,         ///< Sobol points (d <= 3667), random digital shift, inverse normal CDF per
               ///< coordinate: every row marginally N(0, I), unbiased (seed 003)
  sorf,        ///< blocks sqrt(d') H D1 H D2 H D3 (Walsh-Hadamard, random signs, d' = the next
               ///< power of two >= d, first d columns); rows not Gaussian: slightly biased
  simplex,     ///< blocks of d unit directions of a randomly rotated regular simplex (pairwise
               ///< inner product -1/(d-1)), chi(d) or sqrt(d) norms; needs d >= 2
  dct,         ///< DiJiang (seed 003): blocks of d rows t_i c_i, c_i the orthonormal DCT-II basis
               ///< vectors, t_i from a shifted d-point lattice of uniforms u_i (one per block);
               ///< quantile norms: t_i = Phi^-1(u_i) (the paper's); chi: chi(d) quantiles of
               ///< the same u_i. Fixed directions, not N(0, I): biased for SM either way
};

/// Row norms. Valid combinations: iid, qmc take chi only (their norms are as constructed);
/// orthogonal, simplex and sorf take chi or fixed; radial and dct take chi or quantile.
enum class NormMode {
  chi,       ///< chi(d) norms (independent; stratified for radial), so that every row is
             ///< marginally N(0, I) and the estimator unbiased; for qmc: the norms as
             ///< constructed; for sorf and dct: chi(d) norms on their fixed-structure
             ///< directions, which stay biased (default)
  fixed,     ///< every row has norm sqrt(d): estimates the regularised kernel SMREG, not SM
  quantile,  ///< radial: the seed's deterministic chi(d) quantiles i/(m+1) (biased); dct:
             ///< DiJiang's |t_i| = |Phi^-1(u_i)|, half-normal rather than chi(d) (biased)
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
  /// Draws W. Throws favor::Error if m < 1 or d < 1, for a norms mode the kind does not take,
  /// for simplex with d < 2 and for qmc with d > 3667.
  static Projection draw(int64_t m, int64_t d, const ProjectionOptions& options = {});
  /// Wraps a user matrix (e.g. from a trained model). values: m*d floats, row-major, finite.
  static Projection from_matrix(int64_t m, int64_t d, std::vector<float> values);

  /// The same kind, norms, m and d, drawn again with another seed.
  Projection redraw(uint64_t seed) const;

  int64_t m() const { return m_; }
  int64_t d() const { return d_; }
  const std::vector<float>& matrix() const { return *w_; }
  const float* data() const { return w_->data(); }
  float at(int64_t i, int64_t j) const { return (*w_)[static_cast<size_t>(i * d_ + j)]; }
  /// True for matrices that came from from_matrix (redraw then throws).
  bool imported() const { return imported_; }
  const ProjectionOptions& options() const { return options_; }

 private:
  Projection(int64_t m, int64_t d, std::vector<float> w, ProjectionOptions o, bool imported)
      : m_(m),
        d_(d),
        w_(std::make_shared<const std::vector<float>>(std::move(w))),
        options_(o),
        imported_(imported) {}
  int64_t m_ = 0;
  int64_t d_ = 0;
  // Immutable, shared by copies: copying a Projection (into a FeatureMap, a decoder, every
  // call of the Projection overloads) copies a pointer, not m x d floats.
  std::shared_ptr<const std::vector<float>> w_;
  ProjectionOptions options_{};
  bool imported_ = false;
};

std::string to_string(ProjectionKind kind);
std::string to_string(NormMode mode);
/// Parses "iid" / "orthogonal" / "radial" / "qmc" / "sorf" / "simplex" / "dct"; throws favor::Error
/// naming `argument` otherwise.
ProjectionKind parse_projection_kind(const std::string& text, const std::string& argument);
/// Parses "chi" / "fixed" / "quantile"; throws favor::Error naming `argument` otherwise.
NormMode parse_norm_mode(const std::string& text, const std::string& argument);

}  // namespace favor
