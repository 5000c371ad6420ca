#include "meshtrain/trace/trace.h"

#include "meshtrain/io/file.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace meshtrain::trace {

// ---- recording ----

double Recorder::to_us(std::chrono::steady_clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

double Recorder::now_us() const { return to_us(std::chrono::steady_clock::now()); }

void Recorder::add(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

std::vector<Event> Recorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

Recorder::Span::Span(Recorder* r, int rank, Track track, std::string name, std::string category)
    : r_(r) {
  if (!r_) return;
  e_.rank = rank;
  e_.track = track;
  e_.name = std::move(name);
  e_.category = std::move(category);
  e_.t0_us = r_->now_us();
}

Recorder::Span::~Span() {
  if (!r_) return;
  e_.t1_us = r_->now_us();
  r_->add(std::move(e_));
}

// ---- Chrome trace JSON ----

void Recorder::write_chrome_json(const std::string& path) const {
  std::vector<Event> ev = events();
  nlohmann::json out = nlohmann::json::array();
  std::set<int> ranks;
  for (const Event& e : ev) {
    ranks.insert(e.rank);
    out.push_back({{"name", e.name},
                   {"cat", e.category},
                   {"ph", "X"},
                   {"ts", e.t0_us},
                   {"dur", std::max(0.0, e.t1_us - e.t0_us)},
                   {"pid", e.rank},
                   {"tid", static_cast<int>(e.track)}});
  }
  for (int r : ranks) {
    out.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 1}, {"args", {{"name", "communication"}}}});
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 2}, {"args", {{"name", "kernels"}}}});
  }
  io::write_file_atomic(
      path,
      nlohmann::json{{"traceEvents", out}, {"displayTimeUnit", "ms"}, {"otherData", {{"writer", "meshtrain"}}}}.dump() +
          "\n",
      "trace");
}

// ---- analysis ----

namespace {
using Interval = std::pair<double, double>;

std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (auto& i : v) {
    if (!out.empty() && i.first <= out.back().second) out.back().second = std::max(out.back().second, i.second);
    else out.push_back(i);
  }
  return out;
}

double total(const std::vector<Interval>& v) {
  double s = 0;
  for (auto& i : v) s += i.second - i.first;
  return s;
}
}  // namespace

double busy_us(const std::vector<Event>& events, int rank, Track track) {
  std::vector<Interval> v;
  for (const Event& e : events)
    if (e.rank == rank && e.track == track) v.push_back({e.t0_us, e.t1_us});
  return total(merged(v));
}

double hidden_share(const std::vector<Event>& events, int rank,
                    const std::vector<std::string>& categories) {
  std::vector<Interval> comm, compute;
  for (const Event& e : events) {
    if (e.rank != rank) continue;
    if (e.track == Track::comm) comm.push_back({e.t0_us, e.t1_us});
    else if (std::find(categories.begin(), categories.end(), e.category) != categories.end())
      compute.push_back({e.t0_us, e.t1_us});
  }
  comm = merged(comm);
  compute = merged(compute);
  double c = total(comm);
  if (c <= 0) return 0;
  double overlap = 0;
  size_t j = 0;
  for (auto& a : comm) {
    while (j < compute.size() && compute[j].second <= a.first) ++j;
    for (size_t k = j; k < compute.size() && compute[k].first < a.second; ++k)
      overlap += std::min(a.second, compute[k].second) - std::max(a.first, compute[k].first);
  }
  return overlap / c;
}

}  // namespace meshtrain::trace
