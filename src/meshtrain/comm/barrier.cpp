// Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank - 2^k.
// Cost: ceil(log2 p) alpha, no data. A rank leaves only after hearing, directly or through
// others, from every rank.
#include "meshtrain/comm/algorithms.h"

namespace meshtrain::comm {

void dissemination_barrier(OpContext& c) {
  const int p = c.size(), r = c.rank();
  char token = 0, sink = 0;
  for (int d = 1; d < p; d *= 2) {
    auto q = c.irecv((r - d + p) % p, &sink, 1);
    auto s = c.isend((r + d) % p, &token, 1);
    c.wait(q);
    c.wait(s);
  }
}

}  // namespace meshtrain::comm
