#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

std::vector<Param*> Module::params() {
  std::vector<Param*> out;
  collect_params(out);
  return out;
}

std::vector<Param*> Module::buffers() {
  std::vector<Param*> out;
  collect_buffers(out);
  return out;
}

int64_t Module::num_params() {
  int64_t n = 0;
  for (Param* p : params()) n += p->numel();
  return n;
}

void Module::zero_grad() {
  for (Param* p : params()) p->zero_grad();
}

}  // namespace meshtrain::nn
