// Vocabulary of the communication layer: element types, reduction operators, algorithm names,
// one options struct per operation, and the per-communicator statistics.
//
// Limits: element types are float, double and int64 (parameters/gradients, loss sums, step
// counters). Options are plain aggregates so a call reads `comm.all_reduce(x, {.op = max})`.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace meshtrain::comm {

// ---- element types ----
enum class DType : std::uint8_t { f32, f64, i64 };

template <class T>
concept Element = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int64_t>;

template <Element T>
constexpr DType dtype_of() {
  if constexpr (std::same_as<T, float>) return DType::f32;
  else if constexpr (std::same_as<T, double>) return DType::f64;
  else return DType::i64;
}
std::size_t dtype_size(DType t);
const char* to_string(DType t);

// ---- reductions and algorithms ----
enum class ReduceOp : std::uint8_t { sum, avg, max, min };
const char* to_string(ReduceOp op);

// `automatic` picks from the cost model (comm/select.cpp); the others force one algorithm.
// `native` calls the MPI library's own collective (mpi backend only). `hier` (all_reduce only)
// knows hosts: reduce-scatter inside each host, all-reduce across hosts, all-gather inside each
// host (hier.cpp; the group's hosts come from Communicator::set_hosts).
enum class Algorithm : std::uint8_t { automatic, ring, rhd, tree, direct, native, hier, shm };
const char* to_string(Algorithm a);
std::optional<Algorithm> parse_algorithm(std::string_view name);  // "auto", "ring", ...

// ---- deadlines ----
// A timeout of zero means "the communicator's default" (300 s unless set globally with
// Communicator::set_default_timeout or MESHTRAIN_COMM_TIMEOUT_S).
using Timeout = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// ---- options, one struct per operation ----
// chunk_bytes: pipelining segment of ring algorithms (0 = backend default).
struct AllReduceOptions {
  ReduceOp op = ReduceOp::sum;
  Algorithm algorithm = Algorithm::automatic;
  std::size_t chunk_bytes = 0;
  Timeout timeout{0};
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::sum;
  Algorithm algorithm = Algorithm::automatic;
  std::size_t chunk_bytes = 0;
  Timeout timeout{0};
};
struct AllGatherOptions {
  Algorithm algorithm = Algorithm::automatic;
  std::size_t chunk_bytes = 0;
  Timeout timeout{0};
};
struct BroadcastOptions {
  int root = 0;
  Algorithm algorithm = Algorithm::automatic;
  std::size_t chunk_bytes = 0;
  Timeout timeout{0};
};
struct ReduceOptions {
  int root = 0;
  ReduceOp op = ReduceOp::sum;
  Algorithm algorithm = Algorithm::automatic;
  std::size_t chunk_bytes = 0;
  Timeout timeout{0};
};
struct AllToAllOptions {
  Algorithm algorithm = Algorithm::automatic;
  Timeout timeout{0};
};
struct BarrierOptions {
  Timeout timeout{0};
};
struct P2POptions {
  int tag = 0;  // 0 .. kMaxUserTag
  Timeout timeout{0};
};
inline constexpr int kMaxUserTag = (1 << 24) - 1;

// ---- statistics ----
// What one communicator moved and how long its caller sat blocked: synchronous operations
// count their whole duration, async ones the time spent in Work::wait.
struct CommStats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  // Of bytes_sent, those sent to a rank on another host (Communicator::set_hosts; 0 while the
  // group is on one host), counted message by message as they are sent.
  std::uint64_t bytes_sent_cross_host = 0;
  std::uint64_t ops = 0;        // operations issued (collectives and point-to-point)
  double wait_seconds = 0.0;    // time the caller spent blocked
  void reset() { *this = CommStats{}; }
};

}  // namespace meshtrain::comm
