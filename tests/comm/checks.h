// Collective correctness checks shared by the threads tests (test_comm) and the mpirun-launched
// runner (tests/comm/mpi/): every rank fills its input from (rank, index), runs one operation,
// and compares the result with a serial reference computed here from the same formula.
// Inputs are small integers, so float sums are exact whatever the reduction order; avg is
// compared with a relative tolerance. A failed check throws std::runtime_error naming the case.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/select.h"

namespace meshtrain::comm::testing {

// ---- inputs and reference ----
template <class T>
T value(int rank, std::size_t i, int salt = 0) {
  return static_cast<T>(static_cast<long>((static_cast<std::size_t>(rank + 1) * 37 + i * 11 + salt * 5) % 23) - 11);
}

template <class T>
T fold(int p, std::size_t i, ReduceOp op, int salt = 0) {
  T acc = value<T>(0, i, salt);
  for (int r = 1; r < p; ++r) {
    const T v = value<T>(r, i, salt);
    if (op == ReduceOp::sum || op == ReduceOp::avg) acc += v;
    else if (op == ReduceOp::max) acc = v > acc ? v : acc;
    else acc = v < acc ? v : acc;
  }
  if (op == ReduceOp::avg) acc = static_cast<T>(acc / static_cast<T>(p));
  return acc;
}

template <class T>
bool close(T got, T want) {
  if constexpr (std::is_floating_point_v<T>) return std::fabs(got - want) <= 1e-5 * (1 + std::fabs(want));
  else return got == want;
}

struct Case {
  const char* op;
  std::size_t count;
  Algorithm algo;
  std::size_t chunk;
  std::string extra;
};

[[noreturn]] inline void fail_case(const Communicator& c, const Case& k, std::size_t i, double got, double want) {
  std::ostringstream s;
  s << k.op << " world=" << c.size() << " rank=" << c.rank() << " count=" << k.count << " algo=" << to_string(k.algo)
    << " chunk=" << k.chunk << ' ' << k.extra << ": element " << i << " is " << got << ", expected " << want;
  throw std::runtime_error(s.str());
}

// ---- one check per operation ----
template <class T>
void check_all_reduce(Communicator& c, std::size_t n, Algorithm a, ReduceOp op, std::size_t chunk, int mode) {
  // mode 0: in place, 1: out of place, 2: async in place
  const int p = c.size(), r = c.rank();
  std::vector<T> x(n), y(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = value<T>(r, i);
  AllReduceOptions o{.op = op, .algorithm = a, .chunk_bytes = chunk};
  if (mode == 0) c.all_reduce(x, o);
  else if (mode == 1) c.all_reduce(x, y, o);
  else c.all_reduce_async(x, o).wait();
  const std::vector<T>& got = mode == 1 ? y : x;
  Case k{"all_reduce", n, a, chunk, std::string(to_string(op)) + " mode=" + std::to_string(mode) + " " + to_string(dtype_of<T>())};
  for (std::size_t i = 0; i < n; ++i)
    if (!close(got[i], fold<T>(p, i, op))) fail_case(c, k, i, double(got[i]), double(fold<T>(p, i, op)));
  if (mode == 1)
    for (std::size_t i = 0; i < n; ++i)
      if (x[i] != value<T>(r, i)) fail_case(c, {"all_reduce input clobbered", n, a, chunk, ""}, i, double(x[i]), double(value<T>(r, i)));
}

inline std::vector<std::size_t> uneven_counts(int p, std::size_t n) {
  std::vector<std::size_t> cs(p);
  for (int i = 0; i < p; ++i) cs[i] = (n + static_cast<std::size_t>(i) * 3) % (n + 2);  // some zero, all different
  return cs;
}

template <class T>
void check_reduce_scatter(Communicator& c, std::size_t n, Algorithm a, ReduceOp op, bool uneven, bool async) {
  const int p = c.size(), r = c.rank();
  std::vector<std::size_t> cs = uneven ? uneven_counts(p, n) : std::vector<std::size_t>(p, n);
  std::size_t total = 0, off = 0;
  for (int i = 0; i < p; ++i) total += cs[i], off += i < r ? cs[i] : 0;
  std::vector<T> in(total), out(cs[r]);
  for (std::size_t i = 0; i < total; ++i) in[i] = value<T>(r, i);
  ReduceScatterOptions o{.op = op, .algorithm = a};
  if (async) c.reduce_scatter_async(in, out, cs, o).wait();
  else if (uneven) c.reduce_scatter(in, out, cs, o);
  else c.reduce_scatter(in, out, o);
  Case k{"reduce_scatter", n, a, 0, std::string(to_string(op)) + (uneven ? " uneven" : "")};
  for (std::size_t i = 0; i < cs[r]; ++i)
    if (!close(out[i], fold<T>(p, off + i, op))) fail_case(c, k, i, double(out[i]), double(fold<T>(p, off + i, op)));
}

template <class T>
void check_all_gather(Communicator& c, std::size_t n, Algorithm a, bool uneven, bool async) {
  const int p = c.size(), r = c.rank();
  std::vector<std::size_t> cs = uneven ? uneven_counts(p, n) : std::vector<std::size_t>(p, n);
  std::size_t total = 0;
  for (int i = 0; i < p; ++i) total += cs[i];
  std::vector<T> in(cs[r]), out(total, T(-99));
  for (std::size_t i = 0; i < cs[r]; ++i) in[i] = value<T>(r, i, 1);
  AllGatherOptions o{.algorithm = a};
  if (async) c.all_gather_async(in, out, cs, o).wait();
  else if (uneven) c.all_gather(in, out, cs, o);
  else c.all_gather(in, out, o);
  Case k{"all_gather", n, a, 0, uneven ? "uneven" : ""};
  std::size_t at = 0;
  for (int q = 0; q < p; ++q)
    for (std::size_t i = 0; i < cs[q]; ++i, ++at)
      if (out[at] != value<T>(q, i, 1)) fail_case(c, k, at, double(out[at]), double(value<T>(q, i, 1)));
}

template <class T>
void check_broadcast(Communicator& c, std::size_t n, Algorithm a, int root, std::size_t chunk) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = c.rank() == root ? value<T>(root, i, 2) : T(-99);
  c.broadcast(x, {.root = root, .algorithm = a, .chunk_bytes = chunk});
  Case k{"broadcast", n, a, chunk, "root=" + std::to_string(root)};
  for (std::size_t i = 0; i < n; ++i)
    if (x[i] != value<T>(root, i, 2)) fail_case(c, k, i, double(x[i]), double(value<T>(root, i, 2)));
}

template <class T>
void check_reduce(Communicator& c, std::size_t n, Algorithm a, ReduceOp op, int root) {
  const int r = c.rank();
  std::vector<T> in(n), out(r == root ? n : 0);
  for (std::size_t i = 0; i < n; ++i) in[i] = value<T>(r, i);
  c.reduce(in, out, {.root = root, .op = op, .algorithm = a});
  Case k{"reduce", n, a, 0, std::string(to_string(op)) + " root=" + std::to_string(root)};
  for (std::size_t i = 0; r == root && i < n; ++i)
    if (!close(out[i], fold<T>(c.size(), i, op))) fail_case(c, k, i, double(out[i]), double(fold<T>(c.size(), i, op)));
  for (std::size_t i = 0; i < n; ++i)
    if (in[i] != value<T>(r, i)) fail_case(c, {"reduce input clobbered", n, a, 0, ""}, i, double(in[i]), double(value<T>(r, i)));
}

template <class T>
void check_all_to_all(Communicator& c, std::size_t n, Algorithm a) {
  const int p = c.size(), r = c.rank();
  std::vector<T> in(n * p), out(n * p, T(-99));
  // block j of rank r's input: value(r, j*1000 + i)
  for (int j = 0; j < p; ++j)
    for (std::size_t i = 0; i < n; ++i) in[j * n + i] = value<T>(r, j * 1000 + i, 3);
  c.all_to_all(in, out, {.algorithm = a});
  Case k{"all_to_all", n, a, 0, ""};
  for (int q = 0; q < p; ++q)
    for (std::size_t i = 0; i < n; ++i)
      if (out[q * n + i] != value<T>(q, r * 1000 + i, 3)) fail_case(c, k, q * n + i, double(out[q * n + i]), double(value<T>(q, r * 1000 + i, 3)));
}

// Point-to-point: a ring exchange with two tags posted in the opposite order of the sends.
inline void check_p2p(Communicator& c, std::size_t n) {
  const int p = c.size(), r = c.rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  std::vector<float> a(n), b(n), ra(n, -1), rb(n, -1);
  for (std::size_t i = 0; i < n; ++i) a[i] = value<float>(r, i, 4), b[i] = value<float>(r, i, 5);
  Work wb = c.irecv(rb, prev, {.tag = 7});
  Work wa = c.irecv(ra, prev, {.tag = 3});
  Work sa = c.isend(a, next, {.tag = 3});
  c.send(b, next, {.tag = 7});
  wa.wait();
  wb.wait();
  sa.wait();
  for (std::size_t i = 0; i < n; ++i) {
    if (ra[i] != value<float>(prev, i, 4)) fail_case(c, {"p2p tag 3", n, Algorithm::automatic, 0, ""}, i, ra[i], value<float>(prev, i, 4));
    if (rb[i] != value<float>(prev, i, 5)) fail_case(c, {"p2p tag 7", n, Algorithm::automatic, 0, ""}, i, rb[i], value<float>(prev, i, 5));
  }
}

// ---- the whole matrix for one communicator ----
// native on mpi only, shm where the group shares memory; hier where the group spans two or more hosts of as many ranks each.
inline std::vector<Algorithm> algos(OpKind op, const Communicator& c) {
  std::vector<Algorithm> out{Algorithm::automatic};
  for (Algorithm a : algorithms_for(op)) {
    if (a == Algorithm::native && std::string(c.backend()) != "mpi") continue;
    if (a == Algorithm::shm && c.shared_memory_limit() == 0) continue;
    if (a == Algorithm::hier && (c.num_hosts() < 2 || c.ranks_per_host() == 0)) continue;
    out.push_back(a);
  }
  return out;
}

inline const std::vector<std::size_t>& counts() {
  static const std::vector<std::size_t> cs{0, 1, 2, 7, 13, 101, 1031, 65537};  // zero, one, primes, odd sizes
  return cs;
}

inline void check_everything(Communicator& c) {
  for (std::size_t n : counts()) {
    for (Algorithm a : algos(OpKind::all_reduce, c)) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) check_all_reduce<float>(c, n, a, op, 0, 0);
      check_all_reduce<float>(c, n, a, ReduceOp::sum, 0, 1);
      check_all_reduce<float>(c, n, a, ReduceOp::sum, 0, 2);
      check_all_reduce<double>(c, n, a, ReduceOp::avg, 0, 0);
      check_all_reduce<std::int64_t>(c, n, a, ReduceOp::sum, 0, 0);
      check_all_reduce<std::int64_t>(c, n, a, ReduceOp::max, 0, 1);
      if (a == Algorithm::ring) check_all_reduce<float>(c, n, a, ReduceOp::sum, 64, 0);  // many pipelined segments
    }
    for (Algorithm a : algos(OpKind::reduce_scatter, c)) {
      check_reduce_scatter<float>(c, n, a, ReduceOp::sum, false, false);
      check_reduce_scatter<float>(c, n, a, ReduceOp::avg, false, false);
      check_reduce_scatter<std::int64_t>(c, n, a, ReduceOp::min, true, false);
      check_reduce_scatter<float>(c, n, a, ReduceOp::sum, true, true);
    }
    for (Algorithm a : algos(OpKind::all_gather, c)) {
      check_all_gather<float>(c, n, a, false, false);
      check_all_gather<double>(c, n, a, true, false);
      check_all_gather<float>(c, n, a, true, true);
    }
    for (Algorithm a : algos(OpKind::broadcast, c))
      for (int root : {0, c.size() - 1, c.size() / 2}) {
        check_broadcast<float>(c, n, a, root, 0);
        if (a == Algorithm::tree) check_broadcast<std::int64_t>(c, n, a, root, 24);
      }
    for (Algorithm a : algos(OpKind::reduce, c))
      for (int root : {0, c.size() - 1}) {
        check_reduce<float>(c, n, a, ReduceOp::sum, root);
        check_reduce<double>(c, n, a, ReduceOp::avg, root);
        check_reduce<std::int64_t>(c, n, a, ReduceOp::max, root);
      }
    if (n <= 1031)
      for (Algorithm a : algos(OpKind::all_to_all, c)) {
        check_all_to_all<float>(c, n, a);
        check_all_to_all<std::int64_t>(c, n, a);
      }
    check_p2p(c, n);
    c.barrier();
  }
}

}  // namespace meshtrain::comm::testing
