// Errors of the communication layer. Every failure of an operation is a CommError that names
// the operation, the group (communicator name), the per-communicator sequence number and the
// ranks not heard from, so a hang in a 64-rank job reads as one line, not a stack of timeouts.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshtrain::comm {

// ---- CommError ----
enum class ErrorKind {
  timeout,      // the deadline passed before the peers arrived
  peer_failed,  // a peer threw, exited or aborted the group
  mismatch,     // debug mode: ranks issued different collectives
  usage,        // bad arguments (wrong count, root out of range, algorithm not available)
};
const char* to_string(ErrorKind k);

class CommError : public std::runtime_error {
 public:
  CommError(ErrorKind kind, std::string op, std::string group, std::uint64_t seq,
            std::vector<int> ranks, std::string detail);
  ErrorKind kind() const { return kind_; }
  const std::string& op() const { return op_; }
  const std::string& group() const { return group_; }
  std::uint64_t seq() const { return seq_; }
  const std::vector<int>& ranks() const { return ranks_; }  // ranks not heard from / at fault
  const std::string& detail() const { return detail_; }

 private:
  ErrorKind kind_;
  std::string op_, group_;
  std::uint64_t seq_;
  std::vector<int> ranks_;
  std::string detail_;
};

// ---- PeerFailure ----
// Thrown by a transport when a peer is known to be gone (threw, returned, aborted); the
// communicator turns it into a CommError with the operation's context.
struct PeerFailure : std::runtime_error {
  PeerFailure(std::vector<int> r, const std::string& why) : std::runtime_error(why), ranks(std::move(r)) {}
  std::vector<int> ranks;
};

std::string format_ranks(const std::vector<int>& ranks);  // "[1, 3]"

}  // namespace meshtrain::comm
