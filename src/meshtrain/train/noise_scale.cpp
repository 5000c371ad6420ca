#include "meshtrain/train/noise_scale.h"

#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace meshtrain::train {

NoiseEstimate noise_estimate(double sq_small, double sq_big, double b_small, double b_big) {
  if (!(b_small > 0 && b_big > b_small)) throw std::invalid_argument("noise_estimate needs B > b > 0");
  NoiseEstimate e;
  e.grad_sq = (b_big * sq_big - b_small * sq_small) / (b_big - b_small);
  e.trace = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big);
  return e;
}

double stat_efficiency(double noise_scale, double b0, double b) { return (noise_scale + b0) / (noise_scale + b); }

void GradNoiseScale::update(const NoiseEstimate& e) {
  grad_sq_ = theta_ * grad_sq_ + (1 - theta_) * e.grad_sq;
  trace_ = theta_ * trace_ + (1 - theta_) * e.trace;
  weight_ = theta_ * weight_ + (1 - theta_);
}

std::optional<double> GradNoiseScale::scale() const {
  if (weight_ <= 0 || grad_sq() <= 0 || trace() < 0) return std::nullopt;
  return trace() / grad_sq();
}

std::optional<MeasuredNoiseScale> last_noise_scale(const std::string& metrics_path) {
  std::ifstream f(metrics_path, std::ios::binary);
  if (!f) throw std::invalid_argument("cannot read the metrics file " + metrics_path);
  std::optional<MeasuredNoiseScale> last;
  std::string line;
  int64_t number = 0;
  while (std::getline(f, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const bool cut = f.eof();  // the last line, without its newline
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      if (cut) break;
      std::string what = metrics_path;
      what += ": line ";
      what += std::to_string(number);
      what += " is not a JSON object; give a metrics file meshtrain train --metrics wrote";
      throw std::invalid_argument(what);
    }
    const auto v = j.find("grad_noise_scale");
    if (v == j.end() || !v->is_number()) continue;
    const auto s = j.find("step");
    last = MeasuredNoiseScale{v->get<double>(), s != j.end() && s->is_number_integer() ? s->get<int64_t>() : 0};
  }
  if (f.bad()) throw std::invalid_argument("cannot read the metrics file " + metrics_path);
  return last;
}

}  // namespace meshtrain::train
