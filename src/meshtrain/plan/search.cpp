// The layout search (plan/search.h): the space, the parallel prediction and ranking, and the
// advice when nothing fits.
#include "meshtrain/plan/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

namespace meshtrain::plan {

namespace {

bool pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

std::string bytes_text(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[u]);
  return buf;
}

// ---- the space ----

// The ranks of a world of `world` on its fullest node (ranks fill nodes of devices_per_node,
// spread evenly over the nodes they need).
int64_t ranks_per_node(int64_t world, const Hardware& hw) {
  const int64_t per = std::max(1, hw.devices_per_node);
  const int64_t nodes = (world + per - 1) / per;
  return (world + nodes - 1) / nodes;
}

int kernel_threads(int64_t world, const Hardware& hw) {
  if (hw.cores <= 0) return 1;
  const int64_t cores = std::max(1, hw.cores / std::max(1, hw.nodes));
  return static_cast<int>(std::max<int64_t>(1, cores / ranks_per_node(world, hw)));
}

std::vector<int64_t> world_sizes(const Hardware& hw) {
  const int64_t devices = hw.devices();
  std::vector<int64_t> w;
  for (int64_t x = 1; x <= devices; ++x)
    if (devices <= kSmallCluster || pow2(x) || x == devices) w.push_back(x);
  return w;
}

// (dp, tp, pp) of every world size: tp dividing the heads inside a node, pp up to the units.
struct Shape3 {
  int dp, tp, pp;
};
std::vector<Shape3> shapes(const model::ModelSpec& spec, const Hardware& hw) {
  const bool small = hw.devices() <= kSmallCluster;
  const int64_t heads = spec.gpt() ? spec.gpt()->n_head : 1;
  std::vector<int> tps, pps;
  for (int64_t d = 1; d <= heads && d <= hw.devices_per_node; ++d)
    if (heads % d == 0 && (small || pow2(d))) tps.push_back(static_cast<int>(d));
  for (int64_t p = 1; p <= spec.num_units() && p <= hw.devices(); ++p)
    if (small || pow2(p)) pps.push_back(static_cast<int>(p));
  std::vector<Shape3> out;
  for (int64_t w : world_sizes(hw))
    for (int tp : tps)
      for (int pp : pps)
        if (w % (int64_t{tp} * pp) == 0) out.push_back({static_cast<int>(w / (int64_t{tp} * pp)), tp, pp});
  return out;
}

// Powers of two dividing the per-dp batch, pp times them (interleaving needs a multiple of
// pp), and the per-dp batch itself; at most max_m, ascending.
std::vector<int> microbatch_counts(int64_t per_dp, int max_m, int pp) {
  std::set<int> ms;
  for (int64_t base : {int64_t{1}, int64_t{pp}})
    for (int64_t m = base; m <= per_dp && m <= max_m; m *= 2)
      if (per_dp % m == 0) ms.insert(static_cast<int>(m));
  if (per_dp <= max_m) ms.insert(static_cast<int>(per_dp));
  return {ms.begin(), ms.end()};
}

Layout base_layout(const Shape3& s, const SearchOptions& o, const Hardware& hw) {
  Layout l;
  l.dp = s.dp, l.tp = s.tp, l.pp = s.pp;
  l.batch = o.batch, l.seq = o.seq;
  l.optimizer_state = o.optimizer_state;
  l.threads = kernel_threads(l.world(), hw);
  return l;
}

// The layout of shape `s` that holds the least memory: the most micro-batches, 1F1B,
// ZeRO-3 and recomputation where they apply. Unset (dp 0) when the batch does not divide.
Layout leanest(const model::ModelSpec& spec, const Shape3& s, const SearchOptions& o, const Hardware& hw) {
  Layout l = base_layout(s, o, hw);
  if (o.batch % s.dp != 0) {
    l.dp = 0;
    return l;
  }
  l.microbatches = microbatch_counts(o.batch / s.dp, o.max_microbatches, s.pp).back();
  l.zero = s.dp > 1 ? 3 : 0;
  l.recompute = spec.gpt() != nullptr;
  return l;
}

// The least memory need of any leanest layout on `hw` with batch `o.batch` (infinity when
// none is valid); `best` is set to its layout.
double least_need(const model::ModelSpec& spec, const Hardware& hw, const SearchOptions& o, Layout* best) {
  double least = std::numeric_limits<double>::infinity();
  for (const Shape3& s : shapes(spec, hw)) {
    const Layout l = leanest(spec, s, o, hw);
    if (l.dp == 0) continue;
    try {
      const double need = memory_need(predict_memory(spec, l), l, hw);
      if (need < least) least = need, *best = l;
    } catch (const std::invalid_argument&) {
    }
  }
  return least;
}

}  // namespace

std::vector<Layout> enumerate_layouts(const model::ModelSpec& spec, const Cluster& c, const SearchOptions& o) {
  if (o.batch < 1) throw std::invalid_argument("the global batch must be at least 1");
  if (o.seq < 1) throw std::invalid_argument("the sequence length must be at least 1");
  const Hardware& hw = c.hardware;
  const int64_t units = spec.num_units();
  const bool gpt = spec.gpt() != nullptr;
  std::vector<Layout> out;
  for (const Shape3& s : shapes(spec, hw)) {
    if (o.batch % s.dp != 0) continue;
    for (int m : microbatch_counts(o.batch / s.dp, o.max_microbatches, s.pp)) {
      std::vector<std::string> schedules = {"1f1b"};
      if (s.pp > 1) schedules = {"gpipe", "1f1b", "interleaved", "zb"};
      for (const std::string& sched : schedules) {
        if (sched == "interleaved" && (units % (2 * s.pp) != 0 || m % s.pp != 0)) continue;
        for (int zero = 0; zero <= (s.dp > 1 ? 3 : 0); ++zero)
          for (int rc = 0; rc <= (gpt ? 1 : 0); ++rc) {
            Layout l = base_layout(s, o, hw);
            l.microbatches = m, l.schedule = sched, l.chunks = sched == "interleaved" ? 2 : 1;
            l.zero = zero, l.recompute = rc == 1;
            out.push_back(l);
          }
      }
    }
  }
  return out;
}

double memory_need(const std::vector<RankMemory>& memory, const Layout& l, const Hardware& hw) {
  if (hw.cores <= 0) {
    double peak = 0;
    for (const RankMemory& m : memory) peak = std::max(peak, m.total());
    return peak;
  }
  // Threads of one process per node: every pp rank has dp x tp copies; a node holds its share.
  double all = 0;
  for (const RankMemory& m : memory) all += m.total();
  all *= static_cast<double>(l.dp) * l.tp;
  return all * static_cast<double>(ranks_per_node(l.world(), hw)) / l.world();
}

// ---- predicting and ranking ----

SearchResult search_layouts(const model::ModelSpec& spec, const Cluster& c, const SearchOptions& o,
                            const SearchProgress& progress) {
  const Hardware& hw = c.hardware;
  std::vector<Layout> layouts = enumerate_layouts(spec, c, o);
  // The units per stage depend on pp and chunks only: balanced once each, as the trainer does.
  std::map<std::pair<int, int>, std::vector<pipeline::LayerSpan>> spans;
  for (Layout& l : layouts) {
    auto [it, fresh] = spans.try_emplace({l.pp, l.chunks});
    if (fresh) {
      try {
        it->second = balance_stages(spec, l);
      } catch (const std::invalid_argument&) {  // predict refuses it again below, in words
      }
    }
    l.stages = it->second;
  }
  enum class Status { refused, too_big, dominated, fits };
  struct Slot {
    Status status = Status::refused;
    double need = 0;
    Prediction p;
  };
  std::vector<Slot> slots(layouts.size());
  auto evaluate = [&](size_t i) {
    Slot& s = slots[i];
    try {
      s.need = memory_need(predict_memory(spec, layouts[i]), layouts[i], hw);
      if (s.need > hw.memory_bytes) {
        s.status = Status::too_big;
        return;
      }
      s.p = predict(spec, layouts[i], hw);
      s.p.timeline = {}, s.p.schedule = {};  // the caller predicts again what it draws
      s.status = Status::fits;
    } catch (const std::invalid_argument&) {
      s.status = Status::refused;
    }
  };
  // A layout with recomputation is its twin without it plus one more forward: only where the
  // twin does not fit can it rank, so it is predicted only then (enumerate_layouts lists the
  // twin just before it).
  auto twins = [&](size_t a, size_t b) {
    const Layout &x = layouts[a], &y = layouts[b];
    return !x.recompute && y.recompute && x.dp == y.dp && x.tp == y.tp && x.pp == y.pp &&
           x.microbatches == y.microbatches && x.schedule == y.schedule && x.chunks == y.chunks && x.zero == y.zero;
  };
  std::atomic<size_t> next{0}, done{0};
  auto work = [&] {
    for (size_t i = next++; i < layouts.size(); i = next++) {
      if (i > 0 && twins(i - 1, i)) continue;  // taken with its twin
      evaluate(i);
      ++done;
      if (i + 1 < layouts.size() && twins(i, i + 1)) {
        if (slots[i].status == Status::fits) slots[i + 1].status = Status::dominated;
        else evaluate(i + 1);
        ++done;
      }
    }
  };
  const unsigned n = std::max(1u, std::min(std::thread::hardware_concurrency(), 16u));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < n; ++t) pool.emplace_back(work);
  std::thread reporter;
  std::atomic<bool> finished{false};
  if (progress)
    reporter = std::thread([&] {
      while (!finished) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        if (!finished) progress(static_cast<int64_t>(done), static_cast<int64_t>(layouts.size()));
      }
    });
  work();
  for (std::thread& t : pool) t.join();
  finished = true;
  if (reporter.joinable()) reporter.join();

  SearchResult r;
  r.tried = static_cast<int64_t>(layouts.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    switch (s.status) {
      case Status::refused: ++r.refused; continue;
      case Status::dominated: ++r.dominated; continue;
      case Status::too_big: ++r.too_big; break;
      case Status::fits: r.ranked.push_back(std::move(s.p)); break;
    }
    if (s.need < r.smallest_need) r.smallest_need = s.need, r.smallest = layouts[i], r.smallest.stages.clear();
  }
  for (Prediction& p : r.ranked) p.layout.stages.clear();
  std::stable_sort(r.ranked.begin(), r.ranked.end(), [&](const Prediction& a, const Prediction& b) {
    if (a.step_s != b.step_s) return a.step_s < b.step_s;
    const double na = memory_need(a.memory, a.layout, hw), nb = memory_need(b.memory, b.layout, hw);
    if (na != nb) return na < nb;
    return a.layout.world() < b.layout.world();
  });
  return r;
}

// ---- advice ----

std::string advise(const model::ModelSpec& spec, const Cluster& c, const SearchOptions& o, const SearchResult& r) {
  const Hardware& hw = c.hardware;
  const std::string per = c.cpu() ? " per node (its ranks share it)" : " per device";
  std::string s = spec.name() + " fits no layout of the cluster " + c.name + " (" + std::to_string(r.tried) +
                  " tried, global batch " + std::to_string(o.batch) + "): ";
  if (!std::isfinite(r.smallest_need))
    return s + "the cost model refused every one of them; give a global batch or sequence length it can divide";
  s += "the least memory any of them needs is " + bytes_text(r.smallest_need) + per + " (" + r.smallest.describe() +
       ") against the " + bytes_text(hw.memory_bytes) + " it has";

  // Recomputation and ZeRO-3 are in the search: the least need of the layouts without each.
  double no_rc = std::numeric_limits<double>::infinity(), no_z3 = no_rc;
  for (const Layout& l : enumerate_layouts(spec, c, o)) {
    if (l.recompute && l.zero == 3) continue;  // counts towards neither
    try {
      const double need = memory_need(predict_memory(spec, l), l, hw);
      if (!l.recompute) no_rc = std::min(no_rc, need);
      if (l.zero < 3) no_z3 = std::min(no_z3, need);
    } catch (const std::invalid_argument&) {
    }
  }
  const double lean = r.smallest_need;
  auto lowers = [&](const std::string& lever, double before) {
    return before > lean * 1.0001 ? lever + " lowers it from " + bytes_text(before) + " to " + bytes_text(lean)
                                  : lever + " does not lower it";
  };
  const std::string rc = spec.gpt() ? lowers("recomputation", no_rc)
                                    : "recomputation does not apply to " + spec.name() + " (its batch norms)";
  s += "; recomputation and ZeRO-3 are in the search but not enough (" + rc + ", " + lowers("ZeRO-3", no_z3) + ")";

  // More devices: the cluster with 2, 4, ... 1024 x its nodes.
  std::string more;
  for (int k = 2; k <= 1024 && more.empty(); k *= 2) {
    Hardware big = hw;
    big.nodes = hw.nodes * k;
    if (hw.cores > 0) big.cores = hw.cores * k;
    Layout fit;
    if (least_need(spec, big, o, &fit) <= hw.memory_bytes)
      more = std::to_string(k) + " x the nodes (" + std::to_string(big.devices()) + " devices) would fit it (" +
             fit.describe() + ")";
  }
  // Another global batch: the nearest multiples of powers of two, below and above.
  std::string batches;
  {
    std::vector<int64_t> cand;
    for (int64_t q = 2; q <= std::max<int64_t>(2, hw.devices()) * 2; q *= 2) {
      const int64_t down = o.batch / q * q, up = down + q;
      if (down >= 1 && down != o.batch) cand.push_back(down);
      if (up != o.batch) cand.push_back(up);
    }
    std::sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) {
      return std::abs(a - o.batch) != std::abs(b - o.batch) ? std::abs(a - o.batch) < std::abs(b - o.batch) : a < b;
    });
    cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
    int64_t below = 0, above = 0;
    for (int64_t b : cand) {
      if ((b < o.batch && below) || (b > o.batch && above)) continue;
      SearchOptions x = o;
      x.batch = b;
      Layout fit;
      if (least_need(spec, hw, x, &fit) <= hw.memory_bytes) (b < o.batch ? below : above) = b;
      if (below && above) break;
    }
    if (below || above)
      batches = "a global batch of " +
                (below && above ? std::to_string(below) + " or " + std::to_string(above)
                                : std::to_string(below ? below : above)) +
                " would fit";
  }
  if (!batches.empty()) s += "; " + batches;
  if (!more.empty()) s += "; " + more;
  s += std::string("; or give ") + (c.cpu() ? "nodes" : "devices") + " with at least " + bytes_text(lean) + " of memory";
  if (batches.empty() && more.empty()) s += " (more devices, up to 1024 x the nodes, do not make it fit)";
  return s;
}

}  // namespace meshtrain::plan
