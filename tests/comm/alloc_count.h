// Counting the calls of operator new made by one thread (alloc_count.cpp replaces the global
// operator new of the comm test binary; in its own file, so no test inlines it).
#pragma once

namespace meshtrain::comm::testing {
void count_allocations(bool on);  // this thread's calls of operator new count while on
long allocations();               // counted so far, all threads
}  // namespace meshtrain::comm::testing
