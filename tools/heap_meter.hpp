#pragma once
// Counts this program's heap: every operator new and delete goes through here, so a program can
// say how much memory a piece of work held at most (collx-explain and collx-model-bench: what one
// decision of algo::automatic holds). Include it in exactly one translation unit of a program.
// Every form of new and delete that takes no alignment is replaced (plain, array, sized, nothrow):
// a form left to the library would hand out blocks without the header that delete reads.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

// The replacements pair malloc with free behind new and delete, which GCC cannot see through.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#pragma GCC diagnostic ignored "-Warray-bounds"

namespace heap_meter {
inline std::atomic<std::size_t> live{0}, peak{0};
struct header {
  std::size_t n, pad;  // keeps blocks 16-byte aligned
};
/// Starts a measurement; returns the bytes live now.
inline std::size_t start() {
  const std::size_t b = live.load();
  peak.store(b);
  return b;
}
/// The most bytes held since start(base), above base.
inline std::size_t held_since(std::size_t base) { return peak.load() - base; }
}  // namespace heap_meter

void* operator new(std::size_t n) {
  auto* h = static_cast<heap_meter::header*>(std::malloc(n + sizeof(heap_meter::header)));
  if (h == nullptr) throw std::bad_alloc();
  h->n = n;
  const std::size_t now = heap_meter::live.fetch_add(n) + n;
  std::size_t p = heap_meter::peak.load();
  while (now > p && !heap_meter::peak.compare_exchange_weak(p, now)) {}
  return h + 1;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  auto* h = static_cast<heap_meter::header*>(p) - 1;
  heap_meter::live.fetch_sub(h->n);
  std::free(h);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }
void* operator new[](std::size_t n) { return operator new(n); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): a block from any form of
// new carries the header, so every form of delete can read it.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { operator delete(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { operator delete(p); }
void operator delete[](void* p) noexcept { operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { operator delete(p); }
