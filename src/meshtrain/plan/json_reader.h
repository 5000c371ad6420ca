// The strict reading of the planner's JSON files (the machine file, plan/machine.h; the cluster
// file, plan/cluster.h): one object at a time, each field taken once by name, with its type
// and range checked, and done() refusing every field not taken. Every refusal throws
// std::invalid_argument naming the file and the field's path ("m.json: gemm[3].gflops is -1,
// not a positive finite number; <hint>").
//
// Integers are range-checked before they are narrowed (integer(key, lo, hi), int32): a value
// beyond the field's range is refused, never wrapped.
//
// Limits: objects only (arrays are walked by the caller, item() names their entries); no
// defaults: a field is either required (take) or looked up first (has).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace meshtrain::plan {

// What a refusal says beyond the field: which kind of file and how to mend it.
struct JsonFileRules {
  std::string file_kind;  // "a machine file (version 2)": "x is not a field of <file_kind>"
  std::string hint;       // ends every refusal: "fix the field or ..."
};

class JsonReader {
 public:
  using json = nlohmann::json;
  // `source` names the file, `where` the object's path inside it ("" for the top level).
  JsonReader(const json& j, std::string source, std::string where, JsonFileRules rules)
      : j_(j), source_(std::move(source)), where_(std::move(where)), rules_(std::move(rules)) {
    if (!j_.is_object()) fail(where_.empty() ? "the file" : where_, "is not a JSON object");
  }
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw std::invalid_argument(source_ + ": " + field + " " + what + "; " + rules_.hint);
  }
  std::string name(const std::string& key) const { return where_.empty() ? key : where_ + "." + key; }
  bool has(const std::string& key) const { return j_.contains(key); }
  const json& take(const std::string& key) {
    auto it = j_.find(key);
    if (it == j_.end()) fail(name(key), "is missing");
    taken_.insert(key);
    return *it;
  }
  std::string str(const std::string& key) {
    const json& v = take(key);
    if (!v.is_string()) fail(name(key), "is " + std::string(v.type_name()) + ", not a string");
    return v.get<std::string>();
  }
  bool boolean(const std::string& key) {
    const json& v = take(key);
    if (!v.is_boolean()) fail(name(key), "is " + std::string(v.type_name()) + ", not true or false");
    return v.get<bool>();
  }
  std::string word(const std::string& key, std::initializer_list<const char*> allowed) {
    const std::string s = str(key);
    std::string list;
    for (const char* a : allowed) {
      if (s == a) return s;
      list += (list.empty() ? "" : ", ") + std::string(a);
    }
    fail(name(key), "is '" + s + "', not one of " + list);
  }
  // An integer from lo to hi, checked before any narrowing: a number written with a fraction
  // or an exponent (1e12) is refused, not rounded, and so is one beyond int64 (never wrapped).
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) {
    const json& v = take(key);
    const std::string range = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
    if (v.is_number_float()) fail(name(key), "is " + v.dump() + ", not " + range + " (write it without a fraction or exponent)");
    if (!v.is_number_integer()) fail(name(key), "is " + std::string(v.type_name()) + ", not an integer");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi) : v.get<int64_t>() > hi)
      fail(name(key), "is " + v.dump() + ", more than " + std::to_string(hi) + " (it must be " + range + ")");
    const int64_t x = v.get<int64_t>();
    if (x < lo) fail(name(key), "is " + std::to_string(x) + ", less than " + std::to_string(lo));
    return x;
  }
  // An integer that is stored as an int: hi is at most INT_MAX.
  int int32(const std::string& key, int lo, int hi = std::numeric_limits<int>::max()) {
    return static_cast<int>(integer(key, lo, hi));
  }
  // A number above 0 and finite (or at least 0 when `zero_ok`).
  double rate(const std::string& key, bool zero_ok = false) {
    const json& v = take(key);
    if (!v.is_number()) fail(name(key), "is " + std::string(v.type_name()) + ", not a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0 || (x == 0 && !zero_ok)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", x);
      fail(name(key), std::string("is ") + buf + (zero_ok ? ", not a finite number of at least 0" : ", not a positive finite number"));
    }
    return x;
  }
  const json& array(const std::string& key) {
    const json& v = take(key);
    if (!v.is_array()) fail(name(key), "is " + std::string(v.type_name()) + ", not an array");
    return v;
  }
  void done() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!taken_.count(it.key())) fail(name(it.key()), "is not a field of " + rules_.file_kind);
  }
  const std::string& source() const { return source_; }
  const JsonFileRules& rules() const { return rules_; }

 private:
  const json& j_;
  std::string source_, where_;
  JsonFileRules rules_;
  std::set<std::string> taken_;
};

// "list[i]": the path of an array's entry in refusals.
inline std::string json_item(const std::string& list, std::size_t i) { return list + "[" + std::to_string(i) + "]"; }

}  // namespace meshtrain::plan
