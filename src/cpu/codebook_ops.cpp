// Codebook learning on the CPU (cpu/codebook_ops.hpp): each operation gathers the key groups
// (cpu/vq_key_groups.hpp) and runs k-means (cpu/vq_kmeans.hpp), the EMA step (cpu/vq_ema.hpp)
// or the assignment.
#include "cpu/codebook_ops.hpp"

#include <vector>

#include "cpu/vq_ema.hpp"
#include "cpu/vq_key_groups.hpp"
#include "cpu/vq_kmeans.hpp"

namespace favor::cpu {
namespace {

class CpuKMeans final : public kernels::KMeansRun {
 public:
  CpuKMeans(const kernels::CodebookKeys& keys, int64_t codes, int threads)
      : groups_(gather_keys(keys.keys, keys.mask, keys.pooled)), km_(groups_, codes, threads) {}
  void seed(uint64_t seed) override { km_.seed(seed); }
  double assign() override { return km_.assign(); }
  void update() override { km_.update(); }
  const std::vector<float>& codebook() const override { return km_.codebook(); }

 private:
  KeyGroups groups_;  // before km_, which holds a reference to it
  KMeans km_;
};

// The nearest code (z) and squared distance (dist2) of every gathered key.
struct Assigned {
  std::vector<int32_t> z;
  std::vector<float> dist2;
};

Assigned assign_all(const KeyGroups& groups, const kernels::CodebookQuantise& p, int threads) {
  const int64_t total = groups.start[groups.groups];
  Assigned a{std::vector<int32_t>(static_cast<size_t>(total)),
             std::vector<float>(static_cast<size_t>(total))};
  assign_groups(groups, p.codebook, p.codes * groups.d, p.codes, threads, a.z.data(),
                a.dist2.data());
  return a;
}

}  // namespace

std::unique_ptr<kernels::KMeansRun> kmeans_run(const kernels::CodebookKeys& keys, int64_t codes,
                                               const Config& config) {
  return std::make_unique<CpuKMeans>(keys, codes, config.threads);
}

int64_t ema_step(const kernels::CodebookKeys& keys, const kernels::CodebookEMA& p,
                 const Config& config) {
  const KeyGroups groups = gather_keys(keys.keys, keys.mask, keys.pooled);
  return codebook_ema(groups, p, config);
}

double distance_sum(const kernels::CodebookQuantise& p, const Config& config) {
  const KeyGroups groups = gather_keys(p.keys.keys, p.keys.mask, p.keys.pooled);
  const Assigned a = assign_all(groups, p, config.threads);
  double sum = 0.0;
  for (float e : a.dist2) sum += e;
  return sum;
}

double commitment_sum(const kernels::CodebookQuantise& p, float grad, float* dk,
                      const Config& config) {
  const KeyGroups groups = gather_keys(p.keys.keys, p.keys.mask, p.keys.pooled);
  const Assigned a = assign_all(groups, p, config.threads);
  const TensorView& keys = p.keys.keys;
  const MutableTensorView out = MutableTensorView::contiguous(dk, keys.shape);
  const int64_t c = p.codes, d = keys.shape[3];
  double sum = 0.0;
  int64_t r = 0;
  for_each_key(keys, p.keys.mask, p.keys.pooled, [&](int64_t g, int64_t b, int64_t h, int64_t n) {
    const float* code = p.codebook + (g * c + a.z[r++]) * d;
    for (int64_t x = 0; x < d; ++x) {
      const float diff = keys.at(b, h, n, x) - code[x];
      sum += double(diff) * diff;
      out.at(b, h, n, x) = grad * diff;
    }
  });
  return sum;
}

}  // namespace favor::cpu
