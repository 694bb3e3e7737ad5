// StateBlock (the records that cross between ranks) and combine_states, the operation every
// collective of sequence-parallel attention reduces with.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "favor/error.hpp"
#include "favor/sequence_parallel.hpp"

namespace favor {
namespace {

constexpr double kEmpty = -std::numeric_limits<double>::infinity();

int64_t record_bytes_for(int64_t size, bool distance) {
  const int64_t floats = size * (distance ? 2 : 1);
  const auto bytes = static_cast<int64_t>(sizeof(StateHeader)) + floats * 4;
  return (bytes + 7) / 8 * 8;
}

float* values_of(uint8_t* record) {
  return reinterpret_cast<float*>(record + sizeof(StateHeader));
}
const float* values_of(const uint8_t* record) {
  return reinterpret_cast<const float*>(record + sizeof(StateHeader));
}

}  // namespace

StateBlock::StateBlock(int64_t heads, int64_t size, bool distance)
    : heads_(heads),
      size_(size),
      record_bytes_(record_bytes_for(size, distance)),
      distance_(distance) {
  if (heads < 0 || size < 0) throw Error("StateBlock: heads and size must be >= 0");
  storage_.assign(static_cast<size_t>(heads * record_bytes_ / 8), 0);
  clear();
}

StateHeader& StateBlock::header(int64_t head) {
  return *reinterpret_cast<StateHeader*>(data() + head * record_bytes_);
}
const StateHeader& StateBlock::header(int64_t head) const {
  return *reinterpret_cast<const StateHeader*>(data() + head * record_bytes_);
}
float* StateBlock::state(int64_t head) {
  return values_of(data() + head * record_bytes_);
}
const float* StateBlock::state(int64_t head) const {
  return values_of(data() + head * record_bytes_);
}
float* StateBlock::distance_state(int64_t head) {
  return state(head) + size_;
}
const float* StateBlock::distance_state(int64_t head) const {
  return state(head) + size_;
}

void StateBlock::clear() {
  std::fill(storage_.begin(), storage_.end(), 0);
  for (int64_t h = 0; h < heads_; ++h) {
    header(h) = StateHeader{kEmpty, 0.0, size_, distance_ ? 1 : 0};
  }
}

void combine_states(const uint8_t* earlier, uint8_t* later, int64_t count, int64_t record_bytes) {
  for (int64_t r = 0; r < count; ++r) {
    const uint8_t* e = earlier + r * record_bytes;
    uint8_t* l = later + r * record_bytes;
    StateHeader he, hl;
    std::memcpy(&he, e, sizeof he);
    std::memcpy(&hl, l, sizeof hl);
    if (he.size != hl.size || he.distance != hl.distance ||
        record_bytes_for(hl.size, hl.distance != 0) != record_bytes) {
      throw Error("combine_states: records of different layouts (sizes " + std::to_string(he.size) +
                  " and " + std::to_string(hl.size) + ")");
    }
    const float* se = values_of(e);
    float* sl = values_of(l);
    const double top = std::max(he.max, hl.max);
    if (!std::isinf(top)) {
      const float fe = std::isinf(he.max) ? 0.0f : static_cast<float>(std::exp(he.max - top));
      const float fl = std::isinf(hl.max) ? 0.0f : static_cast<float>(std::exp(hl.max - top));
      const auto shift = static_cast<float>(hl.length);  // D of the earlier span moves by it
      for (int64_t i = 0; i < hl.size; ++i) {
        if (hl.distance) {
          sl[hl.size + i] = fe * (se[hl.size + i] + shift * se[i]) + fl * sl[hl.size + i];
        }
        sl[i] = fe * se[i] + fl * sl[i];
      }
    }
    hl.max = top;
    hl.length += he.length;
    std::memcpy(l, &hl, sizeof hl);
  }
}

}  // namespace favor
