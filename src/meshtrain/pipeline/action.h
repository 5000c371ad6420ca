// One step of a pipeline schedule, and its text form (DESIGN decision 4: schedules are data).
//
// An `Action` says which stage does what to which micro-batch. Its text form is
//
//   <stage><KIND><microbatch>[c<chunk>]        e.g.  2F0   1B3   0I2   0W2   5F1c1   1SEND_F0
//
// KIND is F (forward), B (full backward), I (input gradient only), W (weight gradient only),
// or a communication kind: SEND_F / RECV_F move the activation of a forward, SEND_B / RECV_B the
// gradient of a backward (B or I). `stage` is always the stage that performs the action, and the
// peer is implied: `1SEND_F0` sends stage 1's output of micro-batch 0 to stage 2, where
// `2RECV_F0` receives it; `2SEND_B0` sends stage 2's input gradient to stage 1, where `1RECV_B0`
// receives it. `chunk` is which of its rank's model chunks the stage is (0 unless the schedule
// gives a rank several, as interleaved 1F1B does); it is written only when it is not 0, so
// the plain schedules read as in the papers. parse_action(to_string(a)) == a for every action.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::pipeline {

enum class Kind : std::uint8_t { F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B };

struct Action {
  int stage = 0;       // global stage index, 0 .. stages-1
  Kind kind = Kind::F;
  int microbatch = 0;  // 0 .. m-1
  int chunk = 0;       // which model chunk of its rank the stage is, 0 .. v-1
  bool operator==(const Action&) const = default;
};

// ---- kinds ----
const char* to_string(Kind k);              // "F", "SEND_B", ...
bool is_compute(Kind k);                    // F, B, I, W
bool is_send(Kind k);                       // SEND_F, SEND_B
bool is_recv(Kind k);                       // RECV_F, RECV_B
bool is_backward(Kind k);                   // B or I: the actions that produce an input gradient

// ---- text form ----
std::string to_string(const Action& a);
// Throws std::invalid_argument with a sentence naming the text when it is not an action.
Action parse_action(std::string_view text);
// Whitespace-separated actions ("0F0 0F1 0B0 0B1"); an empty text gives an empty list.
std::vector<Action> parse_actions(std::string_view text);
// The inverse of parse_actions: actions joined by single spaces.
std::string to_string(const std::vector<Action>& actions);

}  // namespace meshtrain::pipeline
