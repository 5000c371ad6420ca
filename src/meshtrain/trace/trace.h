// Per-rank timeline recording: spans of compute and communication on separate tracks, written
// as Chrome trace JSON (open in Perfetto or chrome://tracing: one process per rank, one thread
// per track); train/swimlane.h draws them as the SVG swimlane pipeline papers draw. Also the
// overlap figure data parallelism is judged by: the share of communication
// time that ran while the same rank computed.
//
// Concurrency: add() may be called from any thread (rank threads, communicator progress
// threads); a mutex guards the event list. Timestamps are microseconds since the recorder
// was created (steady clock), so every rank of one process shares the time axis.
// Limits: events are kept in memory until written (a few per layer and step).
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace meshtrain::trace {

// compute: a rank's forward, backward and optimizer spans; comm: its collectives and transfers;
// kernels: the library kernels inside its compute spans that a layer times (convolutions),
// nested in the forward and backward spans (a thread of its own in the Chrome trace).
enum class Track : int { compute = 0, comm = 1, kernels = 2 };

struct Event {
  int rank = 0;
  Track track = Track::compute;
  std::string name;      // "forward", "backward", "all_reduce #12", ...
  std::string category;  // "forward", "backward", "optimizer", "wait", "comm"
  double t0_us = 0, t1_us = 0;
};

// The first bytes of every trace meshtrain writes contain this (keys are written sorted).
inline constexpr const char* kTraceWriterMark = "\"otherData\":{\"writer\":\"meshtrain\"}";

class Recorder {
 public:
  Recorder() : origin_(std::chrono::steady_clock::now()) {}
  double now_us() const;
  double to_us(std::chrono::steady_clock::time_point t) const;
  void add(Event e);
  std::vector<Event> events() const;

  // Records [construction, destruction) as one event.
  class Span {
   public:
    Span(Recorder* r, int rank, Track track, std::string name, std::string category);
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Recorder* r_;
    Event e_;
  };

  // The Chrome-trace object format, with {"otherData": {"writer": "meshtrain"}}: the mark by
  // which the output policy (train/outputs.h) knows a trace it may replace. Written atomically
  // (io/file.h): a failure throws io::WriteError naming the file and the cause, and leaves a
  // previous file at `path` as it was.
  void write_chrome_json(const std::string& path) const;

 private:
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

// Share of `rank`'s communication time (comm track) that overlaps its compute spans of the
// given categories (e.g. {"backward"}): 1 = fully hidden, 0 = fully exposed. Returns 0 when
// the rank has no communication.
double hidden_share(const std::vector<Event>& events, int rank,
                    const std::vector<std::string>& compute_categories);
// Total length of the union of `rank`'s spans on `track`, in microseconds.
double busy_us(const std::vector<Event>& events, int rank, Track track);

}  // namespace meshtrain::trace
