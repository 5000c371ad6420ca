// CommError formatting and the small to_string helpers of types.h.
#include "meshtrain/comm/error.h"

#include <sstream>

#include "meshtrain/comm/types.h"

namespace meshtrain::comm {

// ---- names ----
std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i64: return 8;
  }
  return 0;
}
const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i64: return "int64";
  }
  return "?";
}
const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}
const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::automatic: return "auto";
    case Algorithm::ring: return "ring";
    case Algorithm::rhd: return "rhd";
    case Algorithm::tree: return "tree";
    case Algorithm::direct: return "direct";
    case Algorithm::native: return "native";
    case Algorithm::hier: return "hier";
    case Algorithm::shm: return "shm";
  }
  return "?";
}
std::optional<Algorithm> parse_algorithm(std::string_view name) {
  for (Algorithm a : {Algorithm::automatic, Algorithm::ring, Algorithm::rhd, Algorithm::tree,
                      Algorithm::direct, Algorithm::native, Algorithm::hier, Algorithm::shm})
    if (name == to_string(a)) return a;
  return std::nullopt;
}
const char* to_string(ErrorKind k) {
  switch (k) {
    case ErrorKind::timeout: return "timeout";
    case ErrorKind::peer_failed: return "peer failed";
    case ErrorKind::mismatch: return "collective mismatch";
    case ErrorKind::usage: return "usage";
  }
  return "?";
}

std::string format_ranks(const std::vector<int>& ranks) {
  std::ostringstream s;
  s << '[';
  for (std::size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
  s << ']';
  return s.str();
}

// ---- CommError ----
static std::string compose(ErrorKind kind, const std::string& op, const std::string& group,
                           std::uint64_t seq, const std::vector<int>& ranks, const std::string& detail) {
  std::ostringstream s;
  s << op << " #" << seq << " on group '" << group << "' failed (" << to_string(kind) << "): " << detail;
  if (!ranks.empty())
    s << (kind == ErrorKind::mismatch ? "; first mismatching rank: " : "; ranks not heard from: ") << format_ranks(ranks);
  return s.str();
}

CommError::CommError(ErrorKind kind, std::string op, std::string group, std::uint64_t seq,
                     std::vector<int> ranks, std::string detail)
    : std::runtime_error(compose(kind, op, group, seq, ranks, detail)),
      kind_(kind), op_(std::move(op)), group_(std::move(group)), seq_(seq),
      ranks_(std::move(ranks)), detail_(std::move(detail)) {}

}  // namespace meshtrain::comm
