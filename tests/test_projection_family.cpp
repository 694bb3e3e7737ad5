// Projection kinds radial, qmc, sorf, simplex and dct (docs/projections.md, math.md s.3, s.7):
// determinism, block structure, norms, low-discrepancy structure, marginal moments, errors.
// Every random test uses fixed seeds; rerun with
//   build/tests/favor_tests --gtest_filter='ProjectionFamily*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/projection_kinds.hpp"
#include "favor/error.hpp"
#include "favor/projection.hpp"
#include "test_helpers.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_projection_family {
namespace {

struct Combo {
  ProjectionKind kind;
  NormMode norms;
};

// Every valid (kind, norms) pair of the new kinds.
const std::vector<Combo> kCombos = {
    {ProjectionKind::radial, NormMode::chi},  {ProjectionKind::radial, NormMode::quantile},
    {ProjectionKind::qmc, NormMode::chi},     {ProjectionKind::sorf, NormMode::chi},
    {ProjectionKind::simplex, NormMode::chi}, {ProjectionKind::simplex, NormMode::fixed},
    {ProjectionKind::dct, NormMode::chi},     {ProjectionKind::dct, NormMode::quantile},
};

std::string name(const Combo& c) {
  return to_string(c.kind) + "/" + to_string(c.norms);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
  return a.size() >= n && b.size() >= n && std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0;
}

double dot_rows(const Projection& w, int64_t i, int64_t j) {
  double s = 0.0;
  for (int64_t x = 0; x < w.d(); ++x) s += double(w.at(i, x)) * w.at(j, x);
  return s;
}

double row_norm(const Projection& w, int64_t i) {
  return std::sqrt(dot_rows(w, i, i));
}

double normal_cdf(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0));
}

// Kolmogorov-Smirnov statistic sqrt(n) D_n of samples against U(0, 1).
double ks_uniform(std::vector<double> u) {
  std::sort(u.begin(), u.end());
  const double n = double(u.size());
  double d = 0.0;
  for (size_t i = 0; i < u.size(); ++i) {
    d = std::max({d, (i + 1) / n - u[i], u[i] - i / n});
  }
  return std::sqrt(n) * d;
}
// P(sqrt(n) D_n > t) -> 2 sum (-1)^(k-1) exp(-2 k^2 t^2) ~ 2 exp(-2 t^2) = 1e-4 at t = 2.23.
constexpr double kKsBound = 2.23;

void expect_error(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << fragments[0] << "'";
  } catch (const Error& e) {
    for (const std::string& fragment : fragments)
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(ProjectionFamily, SameSeedSameBitsOtherSeedOtherBits) {
  for (const Combo& c : kCombos) {
    for (int64_t d : {1, 5, 16}) {
      if (c.kind == ProjectionKind::simplex && d < 2) continue;
      const ProjectionOptions o{c.kind, c.norms, 123};
      const Projection a = Projection::draw(37, d, o), b = Projection::draw(37, d, o);
      const size_t n = a.matrix().size();
      EXPECT_TRUE(same_bits(a.matrix(), b.matrix(), n)) << name(c) << " d=" << d;
      const Projection other = a.redraw(124);
      EXPECT_EQ(other.options().kind, c.kind);
      EXPECT_EQ(other.options().norms, c.norms);
      EXPECT_FALSE(same_bits(a.matrix(), other.matrix(), n)) << name(c) << " d=" << d;
      EXPECT_TRUE(same_bits(a.matrix(), other.redraw(123).matrix(), n)) << name(c) << " d=" << d;
      for (float x : a.matrix()) ASSERT_TRUE(std::isfinite(x)) << name(c);
    }
  }
}

TEST(ProjectionFamily, BlocksDoNotDependOnM) {
  // qmc: Sobol points are a prefix-stable sequence; sorf and simplex: block b has its own
  // streams. W(m=40) is then bit for bit the first 40 rows of W(m=70).
  for (const Combo& c : kCombos) {
    if (c.kind == ProjectionKind::radial) continue;
    const ProjectionOptions o{c.kind, c.norms, 77};
    const Projection small = Projection::draw(40, 12, o), large = Projection::draw(70, 12, o);
    EXPECT_TRUE(same_bits(small.matrix(), large.matrix(), small.matrix().size())) << name(c);
  }
  // radial: the norms are stratified over all m rows, but the directions of block b are not:
  // the unit rows agree up to the float rounding of each stored row (a few 2^-24).
  for (NormMode norms : {NormMode::chi, NormMode::quantile}) {
    const ProjectionOptions o{ProjectionKind::radial, norms, 77};
    const Projection small = Projection::draw(40, 12, o), large = Projection::draw(70, 12, o);
    for (int64_t i = 0; i < 40; ++i) {
      const double ns = row_norm(small, i), nl = row_norm(large, i);
      for (int64_t j = 0; j < 12; ++j)
        EXPECT_NEAR(small.at(i, j) / ns, large.at(i, j) / nl, 1e-6) << i << "," << j;
    }
  }
}

TEST(ProjectionFamily, GoldenBitsPinTheDefinitions) {
  // FNV-1a over the bits of a 100 x 24 matrix of each kind (seed 5). A change of the
  // definition (streams, order of draws, Boost.Math precision policy) must fail here. The
  // same values came out of g++ 12 and clang++ 14, each at -O0 and at -O3 -march=native.
  const std::vector<std::pair<Combo, uint64_t>> expected = {
      {{ProjectionKind::radial, NormMode::chi}, 0x0e6af4be58699594ull},
      {{ProjectionKind::radial, NormMode::quantile}, 0x4b9468773b42835bull},
      {{ProjectionKind::qmc, NormMode::chi}, 0x8b7c312f9cab8d67ull},
      {{ProjectionKind::sorf, NormMode::chi}, 0xfb9720c43a515c39ull},
      {{ProjectionKind::sorf, NormMode::fixed}, 0x1176d0fe55603403ull},
      {{ProjectionKind::simplex, NormMode::chi}, 0xc4242e53df2567a5ull},
      {{ProjectionKind::simplex, NormMode::fixed}, 0xe6fd7eca4801a25bull},
      {{ProjectionKind::dct, NormMode::chi}, 0x12e9037545d30197ull},
      {{ProjectionKind::dct, NormMode::quantile}, 0x7decb2ec0f838d43ull},
  };
  for (const auto& [c, hash_expected] : expected) {
    const Projection w = Projection::draw(100, 24, {c.kind, c.norms, 5});
    uint64_t hash = 1469598103934665603ull;
    for (float x : w.matrix()) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      hash = (hash ^ bits) * 1099511628211ull;
    }
    EXPECT_EQ(hash, hash_expected) << name(c) << std::hex << " 0x" << hash;
  }
}

TEST(ProjectionFamily, RadialRowsOrthogonalNormsOnePerStratum) {
  // m = 100, d = 16: blocks of 16 rows (the last has 4). Directions are orthonormal up to the
  // float rounding of the stored rows (|cos| <= d 2^-24 ~ 1e-6, as in Projection tests).
  // Sorted norms R_(i) lie one per stratum: F(R_(i)) in ((i-1)/m, i/m]. The stored row's norm
  // is within 2^-24 (relative) of R_i, which moves F by at most max_r r f(r) 2^-24 < 2e-7 for
  // chi(16) (r f(r) <= 2.3): the bound below allows 1e-6.
  const int64_t m = 100, d = 16;
  for (uint64_t seed : {1u, 2u, 3u}) {
    const Projection w = Projection::draw(m, d, {ProjectionKind::radial, NormMode::chi, seed});
    std::vector<double> norms(m);
    for (int64_t i = 0; i < m; ++i) {
      norms[i] = row_norm(w, i);
      for (int64_t j = (i / d) * d; j < std::min(m, (i / d + 1) * d); ++j) {
        if (j == i) continue;
        EXPECT_LE(std::abs(dot_rows(w, i, j)) / (norms[i] * row_norm(w, j)), 4e-6) << i << j;
      }
    }
    EXPECT_FALSE(std::is_sorted(norms.begin(), norms.end()));  // randomly permuted
    std::sort(norms.begin(), norms.end());
    for (int64_t i = 0; i < m; ++i) {
      const double f = detail::chi_cdf(d, norms[i]);
      EXPECT_GT(f, double(i) / m - 1e-6) << "seed " << seed << " i " << i;
      EXPECT_LE(f, double(i + 1) / m + 1e-6) << "seed " << seed << " i " << i;
    }
  }
}

TEST(ProjectionFamily, RadialQuantileNormsAreTheSeedQuantiles) {
  // NormMode::quantile: R_(i) = F^-1(i/(m+1)) exactly before float rounding. chi_quantile
  // inverts chi_cdf to 1e-9 (relative); the stored rows' norms equal float(R_i) up to the
  // rounding of d stored entries (relative 2^-24 each, so the norm within 2^-23 relative).
  for (int64_t d : {1, 3, 16, 64}) {
    for (double p : {1e-12, 1e-6, 0.01, 0.3, 0.5, 0.77, 0.999, 1 - 1e-9}) {
      EXPECT_NEAR(detail::chi_cdf(d, detail::chi_quantile(d, p)), p, 1e-9 * p) << d << " " << p;
    }
  }
  for (auto [m, d] : {std::pair<int64_t, int64_t>{1, 16}, {5, 16}, {64, 16}, {70, 9}}) {
    const Projection w = Projection::draw(m, d, {ProjectionKind::radial, NormMode::quantile, 8});
    std::vector<double> norms(m);
    for (int64_t i = 0; i < m; ++i) norms[i] = row_norm(w, i);
    std::sort(norms.begin(), norms.end());
    for (int64_t i = 0; i < m; ++i) {
      const double p = double(i + 1) / double(m + 1);
      const float expected = static_cast<float>(detail::chi_quantile(d, p));
      EXPECT_NEAR(norms[i], expected, 0x1.0p-22 * expected) << "m " << m << " i " << i;
      EXPECT_NEAR(detail::chi_cdf(d, norms[i]), p, 1e-6) << "m " << m << " i " << i;
    }
  }
}

TEST(ProjectionFamily, SimplexRowsFormRotatedRegularSimplices) {
  // Within a block, unit rows have pairwise cosine -1/(d-1) and sum to 0, up to float rounding
  // of the stored rows (a few 2^-24 per entry: 4e-6 covers d <= 32).
  for (NormMode norms : {NormMode::chi, NormMode::fixed}) {
    for (auto [m, d] : {std::pair<int64_t, int64_t>{20, 8}, {3, 2}, {40, 17}}) {
      const Projection w = Projection::draw(m, d, {ProjectionKind::simplex, norms, 11});
      for (int64_t b = 0; b * d < m; ++b) {
        const int64_t rows = std::min(d, m - b * d);
        std::vector<double> sum(d, 0.0);
        for (int64_t i = b * d; i < b * d + rows; ++i) {
          const double ni = row_norm(w, i);
          if (norms == NormMode::fixed) {
            EXPECT_NEAR(ni, std::sqrt(double(d)), 1e-5);
          }
          for (int64_t x = 0; x < d; ++x) sum[x] += w.at(i, x) / ni;
          for (int64_t j = b * d; j < b * d + rows; ++j) {
            if (j == i) continue;
            EXPECT_NEAR(dot_rows(w, i, j) / (ni * row_norm(w, j)), -1.0 / double(d - 1), 4e-6)
                << "d " << d << " rows " << i << "," << j;
          }
        }
        if (rows == d) {
          for (int64_t x = 0; x < d; ++x) EXPECT_NEAR(sum[x], 0.0, 1e-5) << "d " << d;
        }
      }
      if (m > d) {
        EXPECT_GT(std::abs(dot_rows(w, 0, d)), 1e-3);  // blocks rotate independently
      }
    }
  }
}

TEST(ProjectionFamily, SorfBlocksAreScaledHadamardProducts) {
  // Block entries are integers over d' (Hu D1 Hu D2 Hu D3 / d', |integer| <= d'^1.5), exact
  // in float for d' <= 2^16, so the checks below are exact. d a power of two: rows within a
  // block are orthogonal with squared norm d. Otherwise each full block still has orthogonal
  // columns of squared norm d' (M^T M = d' I), of which W keeps the first d.
  {
    const int64_t m = 40, d = 16;
    const Projection w = Projection::draw(m, d, {ProjectionKind::sorf, NormMode::fixed, 21});
    // chi: the same rows rescaled to independent chi(d) norms (cosine 1 with the fixed ones).
    const Projection c = Projection::draw(m, d, {ProjectionKind::sorf, NormMode::chi, 21});
    for (int64_t i = 0; i < m; ++i) {
      double wc = 0.0, cc = 0.0;
      for (int64_t t = 0; t < d; ++t) {
        wc += double(w.at(i, t)) * c.at(i, t);
        cc += double(c.at(i, t)) * c.at(i, t);
      }
      EXPECT_NEAR(wc / std::sqrt(cc * d), 1.0, 1e-6) << i;
    }
    for (int64_t i = 0; i < m; ++i) {
      EXPECT_EQ(dot_rows(w, i, i), double(d)) << i;
      for (int64_t j = (i / d) * d; j < std::min(m, (i / d + 1) * d); ++j) {
        if (j == i) continue;
        EXPECT_EQ(dot_rows(w, i, j), 0.0) << i << "," << j;
      }
    }
    EXPECT_NE(dot_rows(w, 0, d), 0.0);  // blocks have independent signs
  }
  {
    const int64_t m = 40, d = 12, n = detail::sorf_block_size(d);
    ASSERT_EQ(n, 16);
    const Projection w = Projection::draw(m, d, {ProjectionKind::sorf, NormMode::fixed, 21});
    for (int64_t b = 0; (b + 1) * n <= m; ++b) {
      for (int64_t c = 0; c < d; ++c) {
        for (int64_t c2 = 0; c2 < d; ++c2) {
          double s = 0.0;
          for (int64_t i = b * n; i < (b + 1) * n; ++i) s += double(w.at(i, c)) * w.at(i, c2);
          EXPECT_EQ(s, c == c2 ? double(n) : 0.0) << "block " << b << " cols " << c << "," << c2;
        }
      }
    }
  }
  {
    const Projection w = Projection::draw(5, 1, {ProjectionKind::sorf, NormMode::fixed, 3});
    for (float x : w.matrix()) EXPECT_EQ(std::abs(x), 1.0f);  // d' = 1: products of signs
  }
}

TEST(ProjectionFamily, SorfChiRowsAreFiniteWhenABlockRowIsPadding) {
  // d < d': a block row restricted to the first d coordinates can be zero (d = 3, d' = 4:
  // rows +-e_4 of the 4 x 4 block); chi norms then divided by 0 and gave a NaN row, which
  // attention silently turned into zero rows (found by python/tests/test_properties.py with
  // Projection.draw(17, 3, kind='sorf', seed=1)). Such rows are now fresh Gaussian rows; the
  // other rows keep their bits (their norms come from the same stream positions as before).
  int zero_rows = 0;
  for (int64_t d : {3, 5, 6, 7, 12}) {
    for (uint64_t seed = 0; seed < 40; ++seed) {
      const int64_t m = 64;
      const Projection c = Projection::draw(m, d, {ProjectionKind::sorf, NormMode::chi, seed});
      const Projection f = Projection::draw(m, d, {ProjectionKind::sorf, NormMode::fixed, seed});
      for (int64_t i = 0; i < m; ++i) {
        const double nc = row_norm(c, i), nf = row_norm(f, i);
        ASSERT_TRUE(std::isfinite(nc)) << "d=" << d << " seed=" << seed << " row " << i;
        EXPECT_GT(nc, 0.0) << "d=" << d << " seed=" << seed << " row " << i;
        if (nf == 0.0) {
          ++zero_rows;
          continue;
        }
        double cos = 0.0;  // the other rows: the fixed row's direction, rescaled
        for (int64_t t = 0; t < d; ++t) cos += double(c.at(i, t)) * f.at(i, t);
        EXPECT_NEAR(cos / (nc * nf), 1.0, 1e-6) << "d=" << d << " seed=" << seed << " row " << i;
      }
    }
  }
  EXPECT_GT(zero_rows, 0);  // the case does occur in these draws
}

TEST(ProjectionFamily, QmcCoordinatesAreStratifiedAndMatchTheMatrix) {
  // Over the first 2^k points of a digitally shifted Sobol sequence, every coordinate has
  // exactly one point in each interval [j 2^-k, (j+1) 2^-k) (a (0, k, 1)-net per coordinate;
  // the shift permutes the intervals). Checked on the uniforms, before the normal quantile.
  const int64_t d = 40, n = 1024;
  const std::vector<double> u = detail::sobol_uniforms(n, d, 31);
  for (int k = 0; k <= 10; ++k) {
    const int64_t points = int64_t{1} << k;
    for (int64_t j = 0; j < d; ++j) {
      std::vector<int> hits(points, 0);
      for (int64_t i = 0; i < points; ++i) {
        const double x = u[i * d + j];
        ASSERT_TRUE(x > 0.0 && x < 1.0);
        ++hits[static_cast<size_t>(std::floor(x * points))];
      }
      for (int64_t c = 0; c < points; ++c) ASSERT_EQ(hits[c], 1) << "k " << k << " coord " << j;
    }
  }
  // W is exactly the normal quantile of those uniforms, rounded to float.
  const Projection w = Projection::draw(n, d, {ProjectionKind::qmc, NormMode::chi, 31});
  for (int64_t i = 0; i < n * d; ++i)
    ASSERT_EQ(w.matrix()[i], static_cast<float>(detail::normal_quantile(u[i]))) << i;
  // The normal quantile is antisymmetric and exact at 1/2.
  EXPECT_EQ(detail::normal_quantile(0.5), 0.0);
  EXPECT_EQ(detail::normal_quantile(0.25), -detail::normal_quantile(0.75));
  EXPECT_NEAR(detail::normal_quantile(0.975), 1.959963984540054, 1e-14);
}

TEST(ProjectionFamily, QmcRowsAreMarginallyGaussian) {
  // (a) Across 2000 seeds, the random shift makes each point (the origin, point 0, included)
  // uniform: Phi(w_ij) passes a Kolmogorov-Smirnov test against U(0,1) (sqrt(n) D_n <= 2.23,
  // a false alarm rate of 1e-4 per check for independent uniforms).
  const int64_t d = 6, seeds = 2000;
  for (int64_t point : {0, 3}) {
    for (int64_t j : {0, 5}) {
      std::vector<double> u;
      for (int64_t s = 0; s < seeds; ++s) {
        const Projection w =
            Projection::draw(point + 1, d, {ProjectionKind::qmc, NormMode::chi, uint64_t(s)});
        u.push_back(normal_cdf(w.at(point, j)));
      }
      EXPECT_LE(ks_uniform(u), kKsBound) << "point " << point << " coord " << j;
    }
  }
  // (b) Within one draw, each coordinate's empirical CDF over 4096 points is uniform (far
  // closer than the bound: the points are a net).
  const Projection w = Projection::draw(4096, 8, {ProjectionKind::qmc, NormMode::chi, 9});
  for (int64_t j = 0; j < 8; ++j) {
    std::vector<double> u;
    for (int64_t i = 0; i < w.m(); ++i) u.push_back(normal_cdf(w.at(i, j)));
    EXPECT_LE(ks_uniform(u), kKsBound) << "coord " << j;
  }
}

TEST(ProjectionFamily, UnbiasedKindsHaveStandardNormalEntries) {
  // For the unbiased kinds every single row is exactly N(0, I_d) (radial: the row gets a
  // uniformly random stratum and a uniform point in it, so its norm is chi(d); qmc: each
  // shifted point is uniform on (0,1)^d; simplex and orthogonal: a Haar direction and an
  // independent chi(d) norm). Taking one row per seed (row seed mod m, d = 8 entries) gives
  // n = 4000 * 8 independent N(0,1) samples: E w = 0 with Var w = 1, E w^2 = 1 with
  // Var w^2 = 2, so sigma = sqrt(1/n) resp. sqrt(2/n); the bounds are 5 sigma.
  const int64_t m = 12, d = 8, seeds = 4000;
  for (ProjectionKind kind :
       {ProjectionKind::iid, ProjectionKind::orthogonal, ProjectionKind::radial,
        ProjectionKind::qmc, ProjectionKind::simplex}) {
    double sum = 0.0, sum2 = 0.0, n = 0.0;
    for (int64_t s = 0; s < seeds; ++s) {
      const Projection w = Projection::draw(m, d, {kind, NormMode::chi, uint64_t(1000 + s)});
      for (int64_t j = 0; j < d; ++j) {
        const double x = w.at(s % m, j);
        sum += x;
        sum2 += x * x;
        n += 1.0;
      }
    }
    EXPECT_NEAR(sum / n, 0.0, 5.0 * std::sqrt(1.0 / n)) << to_string(kind);
    EXPECT_NEAR(sum2 / n, 1.0, 5.0 * std::sqrt(2.0 / n)) << to_string(kind);
  }
}

TEST(ProjectionFamily, DctBasisIsTheOrthonormalDctII) {
  // c_i[n] = sqrt((2 - [i == 0]) / d) cos(pi (n + 1/2) i / d), against the unreduced formula
  // in long double, and C C^T = I to 1e-12 in double (d up to 97: sums of d terms of size 2/d).
  for (int64_t d : {1, 2, 7, 16, 64, 97}) {
    std::vector<std::vector<double>> c;
    for (int64_t i = 0; i < d; ++i) c.push_back(detail::dct_basis_vector(d, i));
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t n = 0; n < d; ++n) {
        const long double x = std::sqrt((i == 0 ? 1.0L : 2.0L) / d) *
                              std::cos(3.14159265358979323846264338L * (n + 0.5L) * i / d);
        ASSERT_NEAR(c[i][n], double(x), 1e-14) << "d " << d << " c_" << i << "[" << n << "]";
      }
      for (int64_t j = 0; j < d; ++j) {
        double s = 0.0;
        for (int64_t n = 0; n < d; ++n) s += c[i][n] * c[j][n];
        ASSERT_NEAR(s, i == j ? 1.0 : 0.0, 1e-12) << "d " << d << " <c_" << i << ", c_" << j << ">";
      }
    }
  }
}

TEST(ProjectionFamily, DctRowsAreScaledBasisVectors) {
  // m = 100, d = 24: blocks of 24 rows (the last has 4). Row b*d + i is t_i c_i: its
  // component off c_i is float rounding (|row - t c_i| <= 2^-24 |t| sqrt(d) < 1e-6 |t|), rows
  // of a block are orthogonal (|cos| <= 1e-6, as for orthogonal), and t is the quantile of
  // the block's uniform: Phi^-1(u_i) (quantile) or sign(u_i - 1/2) F^-1(|2 u_i - 1|) with F
  // the chi(d) CDF (chi), to the float rounding of the stored row (2^-24 relative).
  const int64_t m = 100, d = 24;
  for (NormMode norms : {NormMode::chi, NormMode::quantile}) {
    for (uint64_t seed : {1u, 2u}) {
      const Projection w = Projection::draw(m, d, {ProjectionKind::dct, norms, seed});
      for (int64_t b = 0; b * d < m; ++b) {
        const std::vector<double> u = detail::dct_uniforms(d, seed, b);
        const int64_t rows = std::min(d, m - b * d);
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t r = b * d + i;
          const std::vector<double> c = detail::dct_basis_vector(d, i);
          double t = 0.0;
          for (int64_t j = 0; j < d; ++j) t += double(w.at(r, j)) * c[j];
          double off = 0.0;
          for (int64_t j = 0; j < d; ++j) off = std::max(off, std::abs(w.at(r, j) - t * c[j]));
          EXPECT_LE(off, 1e-6 * std::abs(t)) << to_string(norms) << " row " << r;
          const double expected =
              norms == NormMode::quantile
                  ? detail::normal_quantile(u[i])
                  : (u[i] < 0.5 ? -1.0 : 1.0) * detail::chi_quantile(d, std::abs(2 * u[i] - 1));
          EXPECT_NEAR(t, expected, 1e-6 * std::abs(expected) + 1e-30) << "row " << r;
          for (int64_t k = b * d; k < r; ++k) {
            EXPECT_LE(std::abs(dot_rows(w, r, k)) / (row_norm(w, r) * row_norm(w, k)), 1e-6)
                << to_string(norms) << " rows " << r << ", " << k;
          }
        }
      }
    }
  }
}

TEST(ProjectionFamily, DctUniformsAreAShiftedLattice) {
  // The d uniforms of a block, sorted, are s/d + k/d: spacing exactly 1/d (to the rounding
  // of (k + s)/d, a few 2^-53) and the first in (0, 1/d). Read back from W (quantile norms:
  // Phi(t_i), t_i stored in float: |dPhi| <= phi(t) |t| 2^-24 < 2^-25), the spacing holds to
  // 1e-7. Across seeds the shift s (so each u_i) is uniform: KS test on u_0 of block 0 and 1.
  for (int64_t d : {1, 5, 16, 64}) {
    for (int64_t b : {0, 3}) {
      std::vector<double> u = detail::dct_uniforms(d, 17, b);
      std::sort(u.begin(), u.end());
      EXPECT_GT(u[0], 0.0);
      EXPECT_LT(u[0], 1.0 / d);
      for (int64_t k = 1; k < d; ++k) EXPECT_NEAR(u[k] - u[k - 1], 1.0 / d, 1e-15) << d;
      EXPECT_LT(u[d - 1], 1.0);
    }
  }
  const int64_t d = 32;
  const Projection w = Projection::draw(3 * d, d, {ProjectionKind::dct, NormMode::quantile, 4});
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<double> u;
    for (int64_t i = 0; i < d; ++i) {
      double t = 0.0;
      const std::vector<double> c = detail::dct_basis_vector(d, i);
      for (int64_t j = 0; j < d; ++j) t += double(w.at(b * d + i, j)) * c[j];
      u.push_back(normal_cdf(t));
    }
    std::sort(u.begin(), u.end());
    for (int64_t k = 1; k < d; ++k) EXPECT_NEAR(u[k] - u[k - 1], 1.0 / d, 1e-7) << "block " << b;
  }
  for (int64_t b : {0, 1}) {
    std::vector<double> u0;
    for (uint64_t s = 0; s < 2000; ++s) u0.push_back(detail::dct_uniforms(8, s, b)[0]);
    EXPECT_LE(ks_uniform(u0), kKsBound) << "block " << b;
  }
}

TEST(ProjectionFamily, DctAttentionRunsWithThePositiveKernel) {
  // FAVOR+ with dct projections (both norm modes, bidirectional and causal) against the
  // double reference with the same W: the rule of test_attention.cpp (2x the naive float
  // error + 1e-6) is replaced by a plain 1e-4 relative bound, ample for N = 40, m = 32.
  const Tensor q = testing::random_tensor({1, 2, 40, 16}, 1, 1.0);
  const Tensor k = testing::random_tensor({1, 2, 40, 16}, 2, 1.0);
  const Tensor v = testing::random_tensor({1, 2, 40, 8}, 3);
  for (NormMode norms : {NormMode::chi, NormMode::quantile}) {
    const Projection w = Projection::draw(32, 16, {ProjectionKind::dct, norms, 7});
    for (bool causal : {false, true}) {
      AttentionOptions o;
      o.kernel = Kernel::positive;
      o.causal = causal;
      AttentionStats stats;
      const Tensor y = favor_attention(q, k, v, w, o, &stats);
      const auto ref = reference::favor_attention(q, k, v, w, o);
      EXPECT_LE(testing::rel_error(y, ref.values), 1e-4) << to_string(norms) << causal;
      EXPECT_EQ(stats.zero_rows, 0);
    }
  }
}

TEST(ProjectionFamily, ErrorsNameTheArgument) {
  const std::vector<Combo> bad = {
      {ProjectionKind::iid, NormMode::quantile},
      {ProjectionKind::orthogonal, NormMode::quantile},
      {ProjectionKind::radial, NormMode::fixed},
      {ProjectionKind::qmc, NormMode::fixed},
      {ProjectionKind::qmc, NormMode::quantile},
      {ProjectionKind::sorf, NormMode::quantile},
      {ProjectionKind::simplex, NormMode::quantile},
      {ProjectionKind::dct, NormMode::fixed},
  };
  for (const Combo& c : bad) {
    expect_error(
        [&] {
          Projection::draw(8, 4, {c.kind, c.norms, 0});
        },
        {"norms: '" + to_string(c.norms) + "'", to_string(c.kind) + " projections"});
  }
  expect_error(
      [] {
        Projection::draw(8, 1, {ProjectionKind::simplex, NormMode::chi, 0});
      },
      {"d: 1", "simplex", "d >= 2"});
  const int64_t too_big = detail::qmc_max_dimension() + 1;
  EXPECT_GE(too_big - 1, 1111);
  expect_error(
      [&] {
        Projection::draw(2, too_big, {ProjectionKind::qmc, NormMode::chi, 0});
      },
      {"d: " + std::to_string(too_big), "qmc", std::to_string(too_big - 1)});
  EXPECT_NO_THROW(Projection::draw(2, too_big - 1, {ProjectionKind::qmc, NormMode::chi, 0}));
  expect_error([] { parse_projection_kind("gaussian", "--projection"); },
               {"--projection: 'gaussian'", "iid, orthogonal, radial, qmc, sorf, simplex or dct"});
  expect_error([] { parse_norm_mode("median", "--norms"); },
               {"--norms: 'median'", "chi, fixed or quantile"});
  for (ProjectionKind kind :
       {ProjectionKind::iid, ProjectionKind::orthogonal, ProjectionKind::radial,
        ProjectionKind::qmc, ProjectionKind::sorf, ProjectionKind::simplex, ProjectionKind::dct})
    EXPECT_EQ(parse_projection_kind(to_string(kind), "kind"), kind);
  for (NormMode mode : {NormMode::chi, NormMode::fixed, NormMode::quantile})
    EXPECT_EQ(parse_norm_mode(to_string(mode), "norms"), mode);
}

}  // namespace
}  // namespace favor::test_projection_family
