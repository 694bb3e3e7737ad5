#include "cpu/config.hpp"

#include "favor/runtime.hpp"

namespace favor::cpu {

Config runtime_config() {
  return Config{num_threads(), kChunk};
}

}  // namespace favor::cpu
