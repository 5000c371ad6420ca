// The comm test binary's operator new: counts the calls of threads that asked (alloc_count.h).
#include "alloc_count.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
thread_local bool t_counting = false;
std::atomic<long> g_allocations{0};
}  // namespace

namespace meshtrain::comm::testing {
void count_allocations(bool on) { t_counting = on; }
long allocations() { return g_allocations.load(); }
}  // namespace meshtrain::comm::testing

void* operator new(std::size_t n) {
  if (t_counting) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
