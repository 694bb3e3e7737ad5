#pragma once
// The projection kinds of math.md s.3 and s.7 beyond iid (radial, qmc, sorf, simplex, dct) and the
// pieces they share with orthogonal: the Haar-orthogonal d x d block, chi(d) norms and quantiles,
// the inverse normal CDF. Every function is deterministic in its arguments (docs/projections.md).
//
// Random streams: iid uses stream 0, orthogonal block b streams 2b+1 and 2b+2 (projection.cpp).
// The kinds here use stream_id(kind, purpose, index) >= 2^56, one stream per block and purpose,
// so that a block is the same whatever m is and no two kinds share a stream.
#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "favor/projection.hpp"

namespace favor::detail {

/// Stream tags of the kinds below (the top byte of a stream id).
enum class StreamKind : uint64_t { radial = 1, qmc = 2, sorf = 3, simplex = 4, dct = 5 };
/// What a stream draws (the next byte).
enum class StreamUse : uint64_t { gaussian = 0, norms = 1, permutation = 2, signs = 3, shift = 4 };

constexpr uint64_t stream_id(StreamKind kind, StreamUse use, uint64_t index) {
  return (static_cast<uint64_t>(kind) << 56) | (static_cast<uint64_t>(use) << 48) | index;
}

/// Haar-distributed orthonormal directions: the Q of the QR of a d x d Gaussian matrix drawn
/// row by row from Rng(seed, stream), signs fixed so that diag(R) > 0. Returns d x d row-major;
/// row i is column i of Q.
std::vector<double> haar_directions(uint64_t seed, uint64_t stream, int64_t d);

/// The norm of a fresh Gaussian d-vector (d normals from rng): chi(d)-distributed.
double chi_norm(Rng& rng, int64_t d);
/// The chi(d) CDF F(r) = P(d/2, r^2/2) (regularised lower incomplete gamma).
double chi_cdf(int64_t d, double r);
/// F^-1(p) for p in (0, 1): sqrt(2 * gamma_p_inv(d/2, p)).
double chi_quantile(int64_t d, double p);
/// The standard normal quantile Phi^-1(u) for u in (0, 1), antisymmetric about 1/2.
double normal_quantile(double u);
/// Uniform integer in [0, bound), bound >= 1, by rejection (no modulo bias).
uint64_t uniform_below(Rng& rng, uint64_t bound);

/// The largest d of qmc projections: the Sobol direction numbers of Boost.Random (Joe-Kuo).
int64_t qmc_max_dimension();
/// Points 0..n-1 of the d-dimensional Sobol sequence, digitally shifted by one random 64-bit
/// word per dimension, as uniforms in (0, 1): n x d row-major, each in [2^-53, 1 - 2^-53].
std::vector<double> sobol_uniforms(int64_t n, int64_t d, uint64_t seed);
/// The padded dimension of sorf blocks: the smallest power of two >= d.
int64_t sorf_block_size(int64_t d);

/// m x d row-major matrices; arguments already validated by Projection::draw.
std::vector<float> draw_radial(int64_t m, int64_t d, uint64_t seed, NormMode norms);
std::vector<float> draw_qmc(int64_t m, int64_t d, uint64_t seed);
std::vector<float> draw_sorf(int64_t m, int64_t d, uint64_t seed, NormMode norms);
std::vector<float> draw_simplex(int64_t m, int64_t d, uint64_t seed, NormMode norms);
std::vector<float> draw_dct(int64_t m, int64_t d, uint64_t seed, NormMode norms);

/// Basis vector i of the orthonormal DCT-II of size d: c_i[n] = sqrt((2 - [i == 0]) / d)
/// cos(pi (n + 1/2) i / d), n = 0..d-1 (the argument reduced exactly in integers).
std::vector<double> dct_basis_vector(int64_t d, int64_t i);
/// The uniforms of dct block b: u_i = (pi(i) + s) / d for i = 0..d-1, the d-point lattice
/// {k/d} shifted by one s ~ U(0, 1) (one point in each cell [k/d, (k+1)/d)), handed to the
/// basis vectors in the order of a random permutation pi; both from Rng(seed, block b).
std::vector<double> dct_uniforms(int64_t d, uint64_t seed, int64_t block);

}  // namespace favor::detail
