// The machine file's JSON: writing, and the strict reading that names the file and the field
// of every refusal (plan/machine.h). The measurements are in plan/calibrate.cpp (with
// the kernels' rows in calibrate_kernels.cpp and the CNN rows in calibrate_cnn.cpp).
#include "meshtrain/plan/machine.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <set>
#include <stdexcept>

#include "meshtrain/io/file.h"
#include "meshtrain/io/json.h"
#include "meshtrain/plan/json_reader.h"

namespace meshtrain::plan {

namespace {
using nlohmann::json;
// The upper bound of an int64 field (sizes and shapes): nothing is narrowed.
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// ---- strict reading (plan/json_reader.h) ----
// A JSON object of a machine file being read: each field is taken once by name, and done()
// refuses the rest.
struct Reader : JsonReader {
  Reader(const json& j, std::string source, std::string where)
      : JsonReader(j, std::move(source), std::move(where),
                   {"a machine file (version " + std::to_string(kMachineFileVersion) + ")",
                    "fix the field or write the file again with meshtrain calibrate"}) {}
};

std::string item(const std::string& list, std::size_t i) { return json_item(list, i); }

}  // namespace

double MachineProfile::gemm_gflops(const std::string& shape, const std::string& precision, int threads) const {
  double best = 0;
  for (const auto& g : gemm)
    if (g.shape == shape && g.precision == precision && g.threads == threads) best = std::max(best, g.gflops);
  return best;
}

const LinkFit* MachineProfile::link(const std::string& l, const std::string& op) const {
  for (const auto& f : links)
    if (f.link == l && f.op == op) return &f;
  return nullptr;
}

// ---- writing ----
json to_json(const MachineProfile& p) {
  json j;
  j["kind"] = kMachineFileKind;
  j["version"] = p.version;
  j["mode"] = p.mode;
  j["date"] = p.date;
  j["meshtrain_commit"] = p.meshtrain_commit;
  j["host"] = p.host;
  j["cpu_model"] = p.cpu_model;
  j["cores"] = p.cores;
  j["gemm_backend"] = p.gemm_backend;
  j["bf16_isa"] = p.bf16_isa;
  j["calibrate_seconds"] = p.calibrate_seconds;
  j["call_overhead_s"] = p.call_overhead_s;
  j["llc_bytes"] = p.llc_bytes;
  if (p.version >= 3) j["memory_bytes"] = p.memory_bytes;
  j["shared_core_efficiency"] = p.shared_core_efficiency;
  j["oversubscribed_handoff_s"] = p.oversubscribed_handoff_s;
  j["gemm"] = json::array();
  for (const auto& g : p.gemm)
    j["gemm"].push_back({{"shape", g.shape}, {"m", g.m}, {"n", g.n}, {"k", g.k}, {"precision", g.precision},
                         {"threads", g.threads}, {"gflops", g.gflops}, {"cold", g.cold}});
  j["elementwise"] = json::array();
  for (const auto& e : p.elementwise)
    j["elementwise"].push_back(
        {{"op", e.op}, {"elements", e.elements}, {"threads", e.threads}, {"bytes_per_s", e.bytes_per_s}});
  j["attention"] = json::array();
  for (const auto& a : p.attention)
    j["attention"].push_back(
        {{"b", a.b}, {"t", a.t}, {"c", a.c}, {"nh", a.nh}, {"threads", a.threads}, {"gflops", a.gflops}});
  if (p.version >= 4) {
    j["conv"] = json::array();
    for (const auto& c : p.conv)
      j["conv"].push_back({{"format", c.format}, {"n", c.n}, {"ic", c.ic}, {"oc", c.oc}, {"k", c.k},
                           {"stride", c.stride}, {"h", c.h}, {"threads", c.threads}, {"fwd_gflops", c.fwd_gflops},
                           {"bwd_data_gflops", c.bwd_data_gflops}, {"bwd_weights_gflops", c.bwd_weights_gflops}});
    j["cnn_layers"] = json::array();
    for (const auto& l : p.cnn_layers)
      j["cnn_layers"].push_back({{"op", l.op}, {"format", l.format}, {"elements", l.elements}, {"threads", l.threads},
                                 {"fwd_s", l.fwd_s}, {"bwd_s", l.bwd_s}});
  }
  j["links"] = json::array();
  for (const auto& l : p.links) {
    json pts = json::array();
    for (const auto& pt : l.points) pts.push_back({{"bytes", pt.bytes}, {"seconds", pt.seconds}});
    j["links"].push_back({{"link", l.link}, {"op", l.op}, {"world", l.world}, {"alpha_s", l.alpha_s},
                          {"beta_s_per_byte", l.beta_s_per_byte}, {"max_fit_error", l.max_fit_error},
                          {"points", pts}});
  }
  j["not_measured"] = json::array();
  for (const auto& n : p.not_measured) j["not_measured"].push_back({{"what", n.what}, {"reason", n.reason}});
  return j;
}

// ---- reading ----
MachineProfile from_json(const json& j, const std::string& source) {
  Reader r(j, source, "");
  MachineProfile p;
  if (r.str("kind") != kMachineFileKind) r.fail("kind", std::string("is not '") + kMachineFileKind + "'");
  p.version = r.int32("version", 1);
  if (p.version < kMachineFileOldestVersion || p.version > kMachineFileVersion)
    r.fail("version", "is " + std::to_string(p.version) + " but this meshtrain reads versions " +
                          std::to_string(kMachineFileOldestVersion) + " to " + std::to_string(kMachineFileVersion));
  p.mode = r.word("mode", {"quick", "full"});
  p.date = r.str("date");
  p.meshtrain_commit = r.str("meshtrain_commit");
  p.host = r.str("host");
  p.cpu_model = r.str("cpu_model");
  p.cores = r.int32("cores", 1, kMaxMachineCount);
  p.gemm_backend = r.str("gemm_backend");
  p.bf16_isa = r.str("bf16_isa");
  p.calibrate_seconds = r.rate("calibrate_seconds");
  p.call_overhead_s = r.rate("call_overhead_s");
  p.llc_bytes = r.integer("llc_bytes", 0, kNoLimit);
  if (p.version >= 3) p.memory_bytes = r.integer("memory_bytes", 0, kNoLimit);  // version 2: unknown
  p.shared_core_efficiency = r.rate("shared_core_efficiency");
  p.oversubscribed_handoff_s = r.rate("oversubscribed_handoff_s");

  const json& gemm = r.array("gemm");
  for (std::size_t i = 0; i < gemm.size(); ++i) {
    Reader g(gemm[i], source, item("gemm", i));
    GemmRate x;
    x.shape = g.str("shape");
    x.m = g.integer("m", 1, kNoLimit), x.n = g.integer("n", 1, kNoLimit), x.k = g.integer("k", 1, kNoLimit);
    x.precision = g.word("precision", {"float32", "bf16"});
    x.threads = g.int32("threads", 1, kMaxMachineCount);
    x.gflops = g.rate("gflops");
    x.cold = g.boolean("cold");
    g.done();
    p.gemm.push_back(x);
  }
  const json& ew = r.array("elementwise");
  for (std::size_t i = 0; i < ew.size(); ++i) {
    Reader e(ew[i], source, item("elementwise", i));
    ElementwiseRate x;
    x.op = e.word("op", {"add", "layernorm", "gelu", "adamw"});
    x.elements = e.integer("elements", 1, kNoLimit);
    x.threads = e.int32("threads", 1, kMaxMachineCount);
    x.bytes_per_s = e.rate("bytes_per_s");
    e.done();
    p.elementwise.push_back(x);
  }
  const json& att = r.array("attention");
  for (std::size_t i = 0; i < att.size(); ++i) {
    Reader a(att[i], source, item("attention", i));
    AttentionRate x;
    x.b = a.integer("b", 1, kNoLimit), x.t = a.integer("t", 1, kNoLimit), x.c = a.integer("c", 1, kNoLimit),
    x.nh = a.integer("nh", 1, kNoLimit);
    x.threads = a.int32("threads", 1, kMaxMachineCount);
    x.gflops = a.rate("gflops");
    a.done();
    p.attention.push_back(x);
  }
  if (p.version >= 4) {  // older files: no CNN layers (the cost model's fallback)
    const json& conv = r.array("conv");
    for (std::size_t i = 0; i < conv.size(); ++i) {
      Reader c(conv[i], source, item("conv", i));
      ConvRate x;
      x.format = c.word("format", {"blocked", "nchw"});
      x.n = c.integer("n", 1, kNoLimit), x.ic = c.integer("ic", 1, kNoLimit), x.oc = c.integer("oc", 1, kNoLimit);
      x.k = c.integer("k", 1, kNoLimit), x.stride = c.integer("stride", 1, kNoLimit), x.h = c.integer("h", 1, kNoLimit);
      x.threads = c.int32("threads", 1, kMaxMachineCount);
      x.fwd_gflops = c.rate("fwd_gflops");
      x.bwd_data_gflops = c.rate("bwd_data_gflops");
      x.bwd_weights_gflops = c.rate("bwd_weights_gflops");
      c.done();
      p.conv.push_back(x);
    }
    const json& layers = r.array("cnn_layers");
    for (std::size_t i = 0; i < layers.size(); ++i) {
      Reader l(layers[i], source, item("cnn_layers", i));
      LayerRate x;
      x.op = l.word("op", {"batchnorm", "batchnorm_relu", "relu", "add", "add_relu", "maxpool", "avgpool", "global_pool",
                           "concat", "reorder", "gelu", "flatten"});
      x.format = l.word("format", {"blocked", "nchw"});
      x.elements = l.integer("elements", 1, kNoLimit);
      x.threads = l.int32("threads", 1, kMaxMachineCount);
      x.fwd_s = l.rate("fwd_s");
      x.bwd_s = l.rate("bwd_s");
      l.done();
      p.cnn_layers.push_back(x);
    }
  }
  const json& links = r.array("links");
  for (std::size_t i = 0; i < links.size(); ++i) {
    const std::string where = item("links", i);
    Reader l(links[i], source, where);
    LinkFit x;
    x.link = l.word("link", {"threads", "mpi_shared_memory", "mpi_tcp"});
    x.op = l.word("op", {"all_reduce", "sendrecv"});
    x.world = l.int32("world", 2, kMaxMachineCount);
    x.alpha_s = l.rate("alpha_s");
    x.beta_s_per_byte = l.rate("beta_s_per_byte");
    x.max_fit_error = l.rate("max_fit_error", /*zero_ok=*/true);
    const json& pts = l.array("points");
    if (pts.size() < 2) l.fail(where + ".points", "has " + std::to_string(pts.size()) + " entries, fewer than the 2 a fit needs");
    for (std::size_t k = 0; k < pts.size(); ++k) {
      Reader pt(pts[k], source, item(where + ".points", k));
      LinkPoint lp;
      lp.bytes = pt.integer("bytes", 1, kNoLimit);
      lp.seconds = pt.rate("seconds");
      pt.done();
      if (!x.points.empty() && lp.bytes <= x.points.back().bytes)
        pt.fail(item(where + ".points", k) + ".bytes", "is not larger than the point before it (points ascend by bytes)");
      x.points.push_back(lp);
    }
    l.done();
    p.links.push_back(x);
  }
  const json& nm = r.array("not_measured");
  for (std::size_t i = 0; i < nm.size(); ++i) {
    Reader n(nm[i], source, item("not_measured", i));
    p.not_measured.push_back({n.str("what"), n.str("reason")});
    n.done();
  }
  r.done();
  // bf16 rates exist exactly when the CPU has bf16 products.
  bool has_bf16 = false;
  for (const auto& g : p.gemm) has_bf16 = has_bf16 || g.precision == "bf16";
  if (has_bf16 && p.bf16_isa == "emulated")
    r.fail("gemm", "holds bf16 rates but bf16_isa is 'emulated' (no bf16 products on that CPU)");
  if (p.gemm.empty()) r.fail("gemm", "is empty (a machine file holds at least one float32 GEMM rate)");
  return p;
}

MachineProfile read_machine_file(const std::string& path) {
  return from_json(io::read_json_file_strict(path, path, "write it again with meshtrain calibrate"), path);
}

void write_machine_file(const MachineProfile& p, const std::string& path) {
  io::write_file_atomic(path, to_json(p).dump(2) + "\n", "machine file");
}

}  // namespace meshtrain::plan
