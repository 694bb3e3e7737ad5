// Projection kinds radial, qmc, sorf, simplex (math.md s.3) and dct (s.7, docs/projections.md), and
// the Haar block and chi(d) helpers they share with orthogonal. Built like projection.cpp with
// EIGEN_DONT_VECTORIZE and -ffp-contract=off; Boost.Math runs in double (no promotion to
// long double, whose width differs between platforms), so W depends on its arguments alone.
#include "core/projection_kinds.hpp"

#include <Eigen/QR>
#include <algorithm>
#include <boost/math/policies/policy.hpp>
#include <boost/math/special_functions/erf.hpp>
#include <boost/math/special_functions/gamma.hpp>
#include <boost/random/sobol.hpp>
#include <cmath>
#include <numeric>

namespace favor::detail {
namespace {

using DoublePolicy = boost::math::policies::policy<boost::math::policies::promote_double<false>,
                                                   boost::math::policies::promote_float<false>>;

// The largest double below 1: a stratified probability (m - 1 + u)/m can round up to 1.
constexpr double kBelowOne = 1.0 - 0x1.0p-53;

// In-place unnormalised Walsh-Hadamard transform (entries +-1) of a power-of-two length
// vector. On integer-valued input every operation is exact.
void walsh_hadamard(std::vector<double>& v) {
  const size_t n = v.size();
  for (size_t h = 1; h < n; h *= 2) {
    for (size_t i = 0; i < n; i += 2 * h) {
      for (size_t j = i; j < i + h; ++j) {
        const double a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
}

std::vector<double> random_signs(Rng& rng, int64_t n) {
  std::vector<double> s(static_cast<size_t>(n));
  for (double& x : s) x = (rng.next_u64() >> 63) != 0 ? -1.0 : 1.0;
  return s;
}

}  // namespace

std::vector<double> haar_directions(uint64_t seed, uint64_t stream, int64_t d) {
  Rng rng(seed, stream);
  Eigen::MatrixXd g(d, d);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) g(i, j) = rng.normal();
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
  Eigen::MatrixXd q = qr.householderQ();
  const Eigen::MatrixXd& r = qr.matrixQR();
  // Fix the signs so that diag(R) > 0: then Q is Haar-distributed and unique.
  for (int64_t j = 0; j < d; ++j) {
    if (r(j, j) < 0) q.col(j) = -q.col(j);
  }
  std::vector<double> rows(static_cast<size_t>(d * d));
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) rows[static_cast<size_t>(i * d + j)] = q(j, i);
  return rows;
}

double chi_norm(Rng& rng, int64_t d) {
  double sum = 0.0;
  for (int64_t i = 0; i < d; ++i) {
    const double g = rng.normal();
    sum += g * g;
  }
  return std::sqrt(sum);
}

double chi_cdf(int64_t d, double r) {
  if (r <= 0) return 0.0;
  return boost::math::gamma_p(0.5 * static_cast<double>(d), 0.5 * r * r, DoublePolicy());
}

double chi_quantile(int64_t d, double p) {
  return std::sqrt(2.0 * boost::math::gamma_p_inv(0.5 * static_cast<double>(d), p, DoublePolicy()));
}

double normal_quantile(double u) {
  // Phi^-1(u) = -sqrt(2) erfc^-1(2u); the upper half uses 1 - u (exact for u >= 1/2) so that
  // both tails keep full relative precision and the map is exactly antisymmetric.
  if (u < 0.5) return -std::sqrt(2.0) * boost::math::erfc_inv(2.0 * u, DoublePolicy());
  return std::sqrt(2.0) * boost::math::erfc_inv(2.0 * (1.0 - u), DoublePolicy());
}

uint64_t uniform_below(Rng& rng, uint64_t bound) {
  // Reject the lowest 2^64 mod bound values so that every residue is equally likely.
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = rng.next_u64();
    if (r >= threshold) return r % bound;
  }
}

int64_t qmc_max_dimension() {
  return boost::random::default_sobol_table::max_dimension;
}

std::vector<double> sobol_uniforms(int64_t n, int64_t d, uint64_t seed) {
  // One random word per dimension: x XOR shift is uniform on 64-bit words for every point x,
  // and independent across dimensions. The low 64 - k bits of the first 2^k points are zero,
  // so the shift of those bits is the uniform jitter within the finest cell.
  Rng srng(seed, stream_id(StreamKind::qmc, StreamUse::shift, 0));
  std::vector<uint64_t> shift(static_cast<size_t>(d));
  for (uint64_t& s : shift) s = srng.next_u64();
  // The top 52 bits k give (k + 1/2) 2^-52, exact, in [2^-53, 1 - 2^-53].
  const auto to_unit = [](uint64_t x) { return (static_cast<double>(x >> 12) + 0.5) * 0x1.0p-52; };
  std::vector<double> u(static_cast<size_t>(n * d));
  // Point 0 is the origin; Boost's engine starts at point 1 (Gray-code order, so the first
  // 2^k points are the same set as in natural order: a (t, k, d)-net).
  for (int64_t j = 0; j < d; ++j) u[static_cast<size_t>(j)] = to_unit(shift[j]);
  if (n > 1) {
    boost::random::sobol engine(static_cast<size_t>(d));
    for (int64_t i = 1; i < n; ++i)
      for (int64_t j = 0; j < d; ++j)
        u[static_cast<size_t>(i * d + j)] = to_unit(engine() ^ shift[j]);
  }
  return u;
}

int64_t sorf_block_size(int64_t d) {
  int64_t p = 1;
  while (p < d) p *= 2;
  return p;
}

std::vector<float> draw_radial(int64_t m, int64_t d, uint64_t seed, NormMode norms) {
  // Norms: R_i = F^-1(p_i) with p_i = (i - 1 + u_i)/m (stratified, unbiased) or i/(m+1)
  // (quantile, seed 004), handed to the rows in the order of a random permutation.
  std::vector<double> radius(static_cast<size_t>(m));
  Rng urng(seed, stream_id(StreamKind::radial, StreamUse::norms, 0));
  for (int64_t i = 0; i < m; ++i) {
    const double p =
        norms == NormMode::quantile
            ? static_cast<double>(i + 1) / static_cast<double>(m + 1)
            : std::min((static_cast<double>(i) + urng.uniform_open()) / static_cast<double>(m),
                       kBelowOne);
    radius[static_cast<size_t>(i)] = chi_quantile(d, p);
  }
  std::vector<int64_t> order(static_cast<size_t>(m));
  std::iota(order.begin(), order.end(), int64_t{0});
  Rng prng(seed, stream_id(StreamKind::radial, StreamUse::permutation, 0));
  for (int64_t i = m - 1; i > 0; --i) {  // Fisher-Yates
    std::swap(order[static_cast<size_t>(i)],
              order[uniform_below(prng, static_cast<uint64_t>(i) + 1)]);
  }
  std::vector<float> w(static_cast<size_t>(m * d));
  const int64_t blocks = (m + d - 1) / d;
  for (int64_t b = 0; b < blocks; ++b) {
    const std::vector<double> dir =
        haar_directions(seed, stream_id(StreamKind::radial, StreamUse::gaussian, b), d);
    const int64_t rows = std::min(d, m - b * d);
    for (int64_t i = 0; i < rows; ++i) {
      const double norm = radius[static_cast<size_t>(order[static_cast<size_t>(b * d + i)])];
      for (int64_t j = 0; j < d; ++j) {
        w[static_cast<size_t>((b * d + i) * d + j)] =
            static_cast<float>(norm * dir[static_cast<size_t>(i * d + j)]);
      }
    }
  }
  return w;
}

std::vector<float> draw_qmc(int64_t m, int64_t d, uint64_t seed) {
  const std::vector<double> u = sobol_uniforms(m, d, seed);
  std::vector<float> w(u.size());
  for (size_t i = 0; i < u.size(); ++i) w[i] = static_cast<float>(normal_quantile(u[i]));
  return w;
}

std::vector<float> draw_sorf(int64_t m, int64_t d, uint64_t seed, NormMode norms) {
  // Block = sqrt(n) H D1 H D2 H D3 with H = Hu / sqrt(n) (Hu: entries +-1), n = 2^k >= d,
  // i.e. Hu D1 Hu D2 Hu D3 / n: integers over a power of two, computed exactly column by
  // column (3 fast transforms per column). W takes its first d columns (input zero-padded).
  // NormMode::fixed keeps that construction (the paper's SORF: row norms sqrt(n) when d = n,
  // the regularised kernel's bias); NormMode::chi rescales each row to an independent
  // chi(d) norm, as orthogonal does, which leaves only the bias of the directions.
  const int64_t n = sorf_block_size(d);
  const double inv_n = 1.0 / static_cast<double>(n);
  std::vector<float> w(static_cast<size_t>(m * d));
  std::vector<double> col(static_cast<size_t>(n)), block(static_cast<size_t>(n * d));
  const int64_t blocks = (m + n - 1) / n;
  for (int64_t b = 0; b < blocks; ++b) {
    Rng rng(seed, stream_id(StreamKind::sorf, StreamUse::signs, b));
    const std::vector<double> d1 = random_signs(rng, n), d2 = random_signs(rng, n),
                              d3 = random_signs(rng, n);
    const int64_t rows = std::min(n, m - b * n);
    for (int64_t c = 0; c < d; ++c) {
      std::fill(col.begin(), col.end(), 0.0);
      col[static_cast<size_t>(c)] = d3[static_cast<size_t>(c)];
      walsh_hadamard(col);
      for (int64_t i = 0; i < n; ++i) col[static_cast<size_t>(i)] *= d2[static_cast<size_t>(i)];
      walsh_hadamard(col);
      for (int64_t i = 0; i < n; ++i) col[static_cast<size_t>(i)] *= d1[static_cast<size_t>(i)];
      walsh_hadamard(col);
      for (int64_t i = 0; i < rows; ++i) {
        block[static_cast<size_t>(i * d + c)] = col[static_cast<size_t>(i)] * inv_n;
      }
    }
    Rng nrng(seed, stream_id(StreamKind::sorf, StreamUse::norms, b));
    for (int64_t i = 0; i < rows; ++i) {
      const double* row = block.data() + i * d;
      double factor = 1.0;
      if (norms == NormMode::chi) {
        double norm2 = 0.0;
        for (int64_t c = 0; c < d; ++c) norm2 += row[c] * row[c];
        // With d < n a row's first d columns can all be zero (fuzz_attention: m = 7, d = 3,
        // seed 5): it stays a zero row (no direction to rescale) instead of 0/0 = NaN. The
        // norm is drawn all the same, so the rows after it are unchanged.
        const double norm = chi_norm(nrng, d);
        factor = norm2 > 0.0 ? norm / std::sqrt(norm2) : 0.0;
      }
      for (int64_t c = 0; c < d; ++c) {
        w[static_cast<size_t>((b * n + i) * d + c)] = static_cast<float>(factor * row[c]);
      }
    }
  }
  return w;
}

std::vector<float> draw_simplex(int64_t m, int64_t d, uint64_t seed, NormMode norms) {
  // Block b: s_i = sqrt(d/(d-1)) (e_i - 1/d), rotated by a Haar Q: Q s_i = sqrt(d/(d-1)) (q_i -
  // mean of the q_k), q_i the orthonormal directions (columns of Q).
  const double scale = std::sqrt(static_cast<double>(d) / static_cast<double>(d - 1));
  std::vector<float> w(static_cast<size_t>(m * d));
  std::vector<double> center(static_cast<size_t>(d));
  const int64_t blocks = (m + d - 1) / d;
  for (int64_t b = 0; b < blocks; ++b) {
    const std::vector<double> dir =
        haar_directions(seed, stream_id(StreamKind::simplex, StreamUse::gaussian, b), d);
    std::fill(center.begin(), center.end(), 0.0);
    for (int64_t k = 0; k < d; ++k)
      for (int64_t j = 0; j < d; ++j)
        center[static_cast<size_t>(j)] += dir[static_cast<size_t>(k * d + j)];
    for (double& x : center) x /= static_cast<double>(d);
    Rng nrng(seed, stream_id(StreamKind::simplex, StreamUse::norms, b));
    const int64_t rows = std::min(d, m - b * d);
    for (int64_t i = 0; i < rows; ++i) {
      const double norm =
          norms == NormMode::chi ? chi_norm(nrng, d) : std::sqrt(static_cast<double>(d));
      for (int64_t j = 0; j < d; ++j) {
        const double unit =
            scale * (dir[static_cast<size_t>(i * d + j)] - center[static_cast<size_t>(j)]);
        w[static_cast<size_t>((b * d + i) * d + j)] = static_cast<float>(norm * unit);
      }
    }
  }
  return w;
}

std::vector<double> dct_basis_vector(int64_t d, int64_t i) {
  // cos(pi (2n+1) i / (2d)) = cos(pi k / (2d)) with k = (2n+1) i mod 4d, reduced in integers so
  // that std::cos sees an argument in [0, 2 pi) whatever n and i are.
  const double pi = 3.14159265358979323846;
  const double scale = std::sqrt((i == 0 ? 1.0 : 2.0) / static_cast<double>(d));
  std::vector<double> c(static_cast<size_t>(d));
  for (int64_t n = 0; n < d; ++n) {
    const int64_t k = ((2 * n + 1) * i) % (4 * d);
    c[static_cast<size_t>(n)] =
        scale * std::cos(pi * static_cast<double>(k) / static_cast<double>(2 * d));
  }
  return c;
}

std::vector<double> dct_uniforms(int64_t d, uint64_t seed, int64_t block) {
  const uint64_t b = static_cast<uint64_t>(block);
  Rng srng(seed, stream_id(StreamKind::dct, StreamUse::shift, b));
  const double shift = srng.uniform_open();
  std::vector<int64_t> order(static_cast<size_t>(d));
  std::iota(order.begin(), order.end(), int64_t{0});
  Rng prng(seed, stream_id(StreamKind::dct, StreamUse::permutation, b));
  for (int64_t i = d - 1; i > 0; --i) {  // Fisher-Yates
    std::swap(order[static_cast<size_t>(i)],
              order[uniform_below(prng, static_cast<uint64_t>(i) + 1)]);
  }
  std::vector<double> u(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) {
    // (d - 1 + s)/d can round up to 1 for s close to 1.
    u[static_cast<size_t>(i)] = std::min(
        (static_cast<double>(order[static_cast<size_t>(i)]) + shift) / static_cast<double>(d),
        kBelowOne);
  }
  return u;
}

std::vector<float> draw_dct(int64_t m, int64_t d, uint64_t seed, NormMode norms) {
  // Block b, row i: t_i c_i with c_i the DCT-II basis vector i and, for NormMode::quantile,
  // t_i = Phi^-1(u_i) (DiJiang's P = C diag(t)). NormMode::chi keeps the sign of t_i and maps
  // the same uniform p_i = |2 u_i - 1| (|t_i| = Phi^-1((1 + p_i)/2), half-normal) through the
  // chi(d) quantile instead, so that the row norms are chi(d), stratified within the block.
  std::vector<std::vector<double>> basis(static_cast<size_t>(std::min(m, d)));
  for (size_t i = 0; i < basis.size(); ++i) basis[i] = dct_basis_vector(d, int64_t(i));
  std::vector<float> w(static_cast<size_t>(m * d));
  const int64_t blocks = (m + d - 1) / d;
  for (int64_t b = 0; b < blocks; ++b) {
    const std::vector<double> u = dct_uniforms(d, seed, b);
    const int64_t rows = std::min(d, m - b * d);
    for (int64_t i = 0; i < rows; ++i) {
      const double ui = u[static_cast<size_t>(i)];
      double t = normal_quantile(ui);
      if (norms == NormMode::chi) {
        const double r = chi_quantile(d, std::abs(2.0 * ui - 1.0));
        t = ui < 0.5 ? -r : r;
      }
      const std::vector<double>& c = basis[static_cast<size_t>(i)];
      for (int64_t j = 0; j < d; ++j) {
        w[static_cast<size_t>((b * d + i) * d + j)] =
            static_cast<float>(t * c[static_cast<size_t>(j)]);
      }
    }
  }
  return w;
}

}  // namespace favor::detail
