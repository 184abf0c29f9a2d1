// kernels/experiment.h: the environment's answer to a choice still being measured, else the build's.
#include "kernels/experiment.h"

#include <cstdlib>
#include <cstring>

#include "kernels/error.h"

namespace loom {

bool experiment_switch(const char* name, bool built) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return built;
  LOOM_CHECK(std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0, name, " must be 0 or 1, got \"", v, "\"");
  return *v == '1';
}

}  // namespace loom
