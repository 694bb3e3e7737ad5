#pragma once
// A fresh large buffer's pages mapped on favor's threads before it is filled (a tensor's
// values, a saved context's arrays).
#include <cstddef>
#include <vector>

namespace favor::detail {

/// Maps the pages of [data, data + bytes) on favor's threads when it is 2 MiB or more
/// (Linux's MADV_POPULATE_WRITE: contents unchanged; over pages already mapped it only walks
/// the page table). Elsewhere, or where the kernel refuses it, nothing.
void populate_pages(void* data, size_t bytes);

/// v resized to n, the pages of its storage mapped first (populate_pages): the value fill
/// that resize does then writes to mapped pages instead of faulting them in one at a time on
/// the calling thread.
template <class T>
void resize_populated(std::vector<T>& v, size_t n) {
  if (v.capacity() < n) v.reserve(n);
  populate_pages(v.data(), n * sizeof(T));
  v.resize(n);
}

}  // namespace favor::detail
