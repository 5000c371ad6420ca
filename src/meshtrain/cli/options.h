// Option parsing helpers shared by the subcommands.
//
// integer<T>() is a CLI11 check for integer flags: the value must be a plain decimal integer
// that fits T (no fraction, exponent or hex, and no minus sign for an unsigned T). CLI11's own
// conversion would clamp `--steps 99999999999999999999999` and wrap `--seed -1`; this refuses
// both with a sentence (exit 2, as every ParseError). `lo` raises the smallest value accepted.
//
// number(lo, hi, lo_included) is the same for a flag of real numbers: a finite decimal number
// from lo (above lo when !lo_included) to hi. CLI11 reads "nan" and "inf" as numbers, and a
// NaN passes every comparison written as `v <= 0`.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <limits>
#include <string>
#include <type_traits>

#include <CLI/CLI.hpp>

namespace meshtrain::cli {

// Steps between checkpoints when --checkpoint-dir is given without --checkpoint-every.
inline constexpr int64_t kDefaultCheckpointEvery = 1000;

// MESHTRAIN_COMM_TIMEOUT_S, when set, must be a number of seconds above 0 and at most a week;
// anything else throws std::invalid_argument (the communication layer would ignore it).
inline void check_comm_timeout_env() {
  const char* s = std::getenv("MESHTRAIN_COMM_TIMEOUT_S");
  if (!s) return;
  const std::string text = s;
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || !(v > 0 && v <= 604'800))
    throw std::invalid_argument("MESHTRAIN_COMM_TIMEOUT_S='" + text +
                                "' is not a number of seconds above 0 and at most 604800 (a week); fix it or unset it");
}

template <class T>
CLI::Validator integer(T lo = std::numeric_limits<T>::min()) {
  static_assert(std::is_integral_v<T>);
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        const std::string range =
            "an integer from " + std::to_string(lo) + " to " + std::to_string(std::numeric_limits<T>::max());
        const char* begin = text.data() + (text.size() > 1 && text[0] == '+' ? 1 : 0);
        const char* end = text.data() + text.size();
        T v{};
        auto [ptr, ec] = std::from_chars(begin, end, v);
        if (ec == std::errc::result_out_of_range || (ec == std::errc() && ptr == end && v < lo) ||
            (std::is_unsigned_v<T> && !text.empty() && text[0] == '-' &&
             text.find_first_not_of("0123456789", 1) == std::string::npos && text.size() > 1))
          return "'" + text + "' is out of range; give " + range;
        if (ec != std::errc() || ptr != end) return "'" + text + "' is not a whole number; give " + range;
        return {};
      },
      "", "integer");
}

// A CLI11 check for a path flag: an empty value would silently mean "not given" (or a file
// with no name, found only when writing it): refused with a sentence, exit 2.
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "the path is empty; give a file name (or leave the flag out)" : std::string();
      },
      "", "path");
}

inline CLI::Validator number(double lo, double hi, bool lo_included) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        auto fmt = [](double x) {
          std::string t = std::to_string(x);
          t.erase(t.find_last_not_of('0') + 1);
          if (t.back() == '.') t.pop_back();
          return t;
        };
        const std::string range = std::string(lo_included ? "a number from " : "a number above ") + fmt(lo) +
                                  (lo_included ? " to " : " and at most ") + fmt(hi);
        const char* begin = text.data() + (text.size() > 1 && text[0] == '+' ? 1 : 0);
        const char* end = text.data() + text.size();
        double v = 0;
        auto [ptr, ec] = std::from_chars(begin, end, v);
        if (ec != std::errc() || ptr != end || !std::isfinite(v))
          return "'" + text + "' is not a finite number; give " + range;
        if (v > hi || v < lo || (!lo_included && v == lo)) return "'" + text + "' is out of range; give " + range;
        return {};
      },
      "", "number");
}

}  // namespace meshtrain::cli
