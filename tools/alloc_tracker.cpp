#include "alloc_tracker.hpp"

#include <malloc.h>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace favor::cli {
namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_base{0};

void* allocate(std::size_t size, std::size_t align) {
  void* p = align > alignof(std::max_align_t)
                ? std::aligned_alloc(align, (size + align - 1) / align * align)
                : std::malloc(size ? size : 1);
  if (!p) throw std::bad_alloc();
  const auto bytes = static_cast<int64_t>(malloc_usable_size(p));
  const int64_t now = g_live.fetch_add(bytes) + bytes;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void release(void* p) {
  if (!p) return;
  g_live.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)));
  std::free(p);
}
}  // namespace

void reset_heap_peak() {
  g_base.store(g_live.load());
  g_peak.store(g_live.load());
}

int64_t heap_peak_growth() {
  return g_peak.load() - g_base.load();
}

}  // namespace favor::cli

void* operator new(std::size_t size) {
  return favor::cli::allocate(size, 0);
}
void* operator new[](std::size_t size) {
  return favor::cli::allocate(size, 0);
}
void* operator new(std::size_t size, std::align_val_t a) {
  return favor::cli::allocate(size, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t size, std::align_val_t a) {
  return favor::cli::allocate(size, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept {
  favor::cli::release(p);
}
void operator delete[](void* p) noexcept {
  favor::cli::release(p);
}
void operator delete(void* p, std::size_t) noexcept {
  favor::cli::release(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  favor::cli::release(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  favor::cli::release(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  favor::cli::release(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  favor::cli::release(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  favor::cli::release(p);
}
// The nothrow forms too: the standard's defaults call the forms above, but a sanitizer
// runtime (ASan) replaces them with its own, and its allocations then reached free() through
// the operator delete above (alloc-dealloc-mismatch under `make fuzz`).
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return favor::cli::allocate(size, 0);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return favor::cli::allocate(size, 0);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new(std::size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return favor::cli::allocate(size, static_cast<std::size_t>(a));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return favor::cli::allocate(size, static_cast<std::size_t>(a));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  favor::cli::release(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  favor::cli::release(p);
}
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  favor::cli::release(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  favor::cli::release(p);
}
