// Text form of pipeline actions; see action.h for the grammar.
#include "meshtrain/pipeline/action.h"

#include <array>
#include <cctype>
#include <charconv>
#include <stdexcept>
#include <utility>

namespace meshtrain::pipeline {

namespace {

// Longest names first is not needed: no name is a prefix of another.
constexpr std::array<std::pair<Kind, std::string_view>, 8> kKindNames{{
    {Kind::F, "F"},
    {Kind::B, "B"},
    {Kind::I, "I"},
    {Kind::W, "W"},
    {Kind::SEND_F, "SEND_F"},
    {Kind::RECV_F, "RECV_F"},
    {Kind::SEND_B, "SEND_B"},
    {Kind::RECV_B, "RECV_B"},
}};

[[noreturn]] void bad(std::string_view text, const char* why) {
  throw std::invalid_argument("pipeline action '" + std::string(text) + "' is not of the form " +
                              "<stage><KIND><microbatch>[c<chunk>] (e.g. 2F0, 1SEND_F3, 5B1c1): " +
                              why + ".");
}

// Reads a non-negative decimal number at `pos`, advancing it.
int read_number(std::string_view text, std::size_t& pos, const char* what) {
  std::size_t end = pos;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  if (end == pos) bad(text, what);
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data() + pos, text.data() + end, value);
  if (ec != std::errc{} || ptr != text.data() + end) bad(text, "a number is too large");
  pos = end;
  return value;
}

}  // namespace

const char* to_string(Kind k) {
  for (const auto& [kind, name] : kKindNames)
    if (kind == k) return name.data();
  return "?";
}

bool is_compute(Kind k) { return k == Kind::F || k == Kind::B || k == Kind::I || k == Kind::W; }
bool is_send(Kind k) { return k == Kind::SEND_F || k == Kind::SEND_B; }
bool is_recv(Kind k) { return k == Kind::RECV_F || k == Kind::RECV_B; }
bool is_backward(Kind k) { return k == Kind::B || k == Kind::I; }

std::string to_string(const Action& a) {
  std::string s = std::to_string(a.stage) + to_string(a.kind) + std::to_string(a.microbatch);
  if (a.chunk != 0) {
    s += 'c';
    s += std::to_string(a.chunk);
  }
  return s;
}

Action parse_action(std::string_view text) {
  Action a;
  std::size_t pos = 0;
  a.stage = read_number(text, pos, "it must start with the stage number");
  std::size_t name_end = pos;
  while (name_end < text.size() &&
         (std::isupper(static_cast<unsigned char>(text[name_end])) || text[name_end] == '_'))
    ++name_end;
  std::string_view name = text.substr(pos, name_end - pos);
  bool found = false;
  for (const auto& [kind, kind_name] : kKindNames) {
    if (kind_name == name) {
      a.kind = kind;
      found = true;
    }
  }
  if (!found) bad(text, "the kind must be one of F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B");
  pos = name_end;
  a.microbatch = read_number(text, pos, "the kind must be followed by the micro-batch number");
  if (pos < text.size()) {
    if (text[pos] != 'c') bad(text, "only a chunk suffix c<chunk> may follow the micro-batch");
    ++pos;
    a.chunk = read_number(text, pos, "the chunk suffix needs a number after 'c'");
    if (pos != text.size()) bad(text, "nothing may follow the chunk number");
  }
  return a;
}

std::vector<Action> parse_actions(std::string_view text) {
  std::vector<Action> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
    std::size_t end = pos;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    if (end > pos) out.push_back(parse_action(text.substr(pos, end - pos)));
    pos = end;
  }
  return out;
}

std::string to_string(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) {
    if (!s.empty()) s += ' ';
    s += to_string(a);
  }
  return s;
}

}  // namespace meshtrain::pipeline
