// Direct all-to-all: every rank posts its p-1 receives and p-1 sends at once (in the order
// r+1, r+2, ... so that the pairs are staggered) and copies its own block locally.
//
// Cost: (p-1) alpha + (p-1)/p n beta, where n is the size of the whole input of one rank; all
// messages are in flight together, so on a shared-memory node the latency terms overlap.
#include <cstring>

#include "meshtrain/comm/algorithms.h"

namespace meshtrain::comm {

void direct_all_to_all(OpContext& c, const void* in, void* out, std::size_t block) {
  const int p = c.size(), r = c.rank();
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  if (block == 0) return;
  std::vector<RequestPtr> reqs;
  for (int i = 1; i < p; ++i) {
    const int from = (r - i + p) % p;
    reqs.push_back(c.irecv(from, dst + from * block, block));
  }
  for (int i = 1; i < p; ++i) {
    const int to = (r + i) % p;
    reqs.push_back(c.isend(to, src + to * block, block));
  }
  if (src != dst) std::memcpy(dst + r * block, src + r * block, block);
  c.wait_all(reqs);
}

}  // namespace meshtrain::comm
