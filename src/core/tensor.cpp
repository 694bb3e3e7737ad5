#include "favor/tensor.hpp"

#include <cstdint>
#include <sstream>

#include "core/helper_threads.hpp"
#include "core/pages.hpp"
#include "favor/error.hpp"
#include "favor/runtime.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace favor {
namespace detail {

// Below this many bytes a tensor's pages are left to the fill (a decode step's outputs).
constexpr size_t kPrefaultBytes = size_t{1} << 21;

// A fresh buffer of a large tensor is mapped by the kernel one page fault at a time, each
// page zeroed on the thread that first writes it: the fill after it (Tensor's below, a saved
// context's resize: resize_populated) did that alone, and for
// a backward's three gradients at N = 4096 (24 MB, memory glibc had just returned to the
// system) it was about a fifth of the call on 2 threads. The pages are mapped here on
// favor's threads instead, a share each (Linux's MADV_POPULATE_WRITE, 5.14 on: contents
// unchanged; over pages already mapped, such as a reused heap block, it only walks the
// page table), and the fill then writes to mapped pages. Elsewhere, or where the kernel
// refuses it, nothing happens here.
void populate_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  if (bytes < kPrefaultBytes) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end <= begin) return;
  // (one thread under a load, as the kernels' regions: cpu/team.hpp)
  const int threads = detail::helper_team();
  const uintptr_t pages = (end - begin) / page;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int t = 0; t < threads; ++t) {
    const uintptr_t first = begin + pages * t / threads * page;
    const uintptr_t last = begin + pages * (t + 1) / threads * page;
    if (last > first)
      (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE);
  }
  detail::team_ran(threads);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace detail

Shape4 contiguous_strides(const Shape4& shape) {
  return {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
}

Tensor::Tensor(const Shape4& shape, float fill) : shape_(shape) {
  for (int64_t s : shape) {
    if (s < 0) throw Error("Tensor: shape " + shape_string(shape) + " has a negative extent");
  }
  const auto count = static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]);
  data_.reserve(count);
  detail::populate_pages(data_.data(), count * sizeof(float));
  data_.assign(count, fill);
}

Tensor::Tensor(const Shape4& shape, std::vector<float> values)
    : shape_(shape), data_(std::move(values)) {
  const int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
  if (n != static_cast<int64_t>(data_.size())) {
    throw Error("Tensor: shape " + shape_string(shape) + " needs " + std::to_string(n) +
                " values, got " + std::to_string(data_.size()));
  }
}

std::string shape_string(const Shape4& shape) {
  std::ostringstream os;
  os << '[' << shape[0] << ',' << shape[1] << ',' << shape[2] << ',' << shape[3] << ']';
  return os.str();
}

}  // namespace favor
