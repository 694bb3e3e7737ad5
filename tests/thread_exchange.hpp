#pragma once
// An in-process favor::Exchange for the tests: P threads play the ranks of one sequence and
// meet at a barrier for every collective (the MPI implementation is tested under mpirun in
// tests/distributed/). Reductions combine in rank order, as a scan does.
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "favor/sequence_parallel.hpp"

namespace favor::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), slots_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  /// Publishes `mine` as rank r's slot, waits for every rank, returns all slots (rank order).
  std::vector<std::vector<uint8_t>> exchange(int r, std::vector<uint8_t> mine) {
    slots_[static_cast<size_t>(r)] = std::move(mine);
    barrier();
    std::vector<std::vector<uint8_t>> all = slots_;
    barrier();  // nobody overwrites a slot before everyone has read it
    return all;
  }

 private:
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (++waiting_ == size_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }
  int size_;
  std::vector<std::vector<uint8_t>> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int waiting_ = 0;
  int64_t generation_ = 0;
};

class ThreadExchange : public Exchange {
 public:
  ThreadExchange(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }

  std::vector<int64_t> allgather(const std::vector<int64_t>& values) override {
    std::vector<int64_t> out;
    for (const auto& s : group_.exchange(rank_, bytes_of(values))) {
      const auto* x = reinterpret_cast<const int64_t*>(s.data());
      out.insert(out.end(), x, x + s.size() / sizeof(int64_t));
    }
    return out;
  }
  std::vector<std::string> allgather_text(const std::string& text) override {
    std::vector<std::string> out;
    for (const auto& s : group_.exchange(rank_, std::vector<uint8_t>(text.begin(), text.end())))
      out.emplace_back(s.begin(), s.end());
    return out;
  }
  void allreduce_sum(double* data, int64_t n) override { sum(data, n); }
  void allreduce_sum(float* data, int64_t n) override { sum(data, n); }

  void allreduce_states(StateBlock& block) override {
    const auto all = group_.exchange(rank_, bytes_of(block));
    std::vector<uint8_t> acc = all[0];
    for (size_t r = 1; r < all.size(); ++r) acc = combined(acc, all[r], block);
    std::memcpy(block.data(), acc.data(), acc.size());
  }
  void exscan_states(StateBlock& block, bool reverse) override {
    const auto all = group_.exchange(rank_, bytes_of(block));
    block.clear();
    const int P = size();
    std::vector<uint8_t> acc(block.data(), block.data() + block.bytes());
    if (!reverse) {
      for (int r = 0; r < rank_; ++r) acc = combined(acc, all[static_cast<size_t>(r)], block);
    } else {
      for (int r = P - 1; r > rank_; --r) acc = combined(acc, all[static_cast<size_t>(r)], block);
    }
    std::memcpy(block.data(), acc.data(), acc.size());
  }

 private:
  template <class T>
  static std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    return std::vector<uint8_t>(p, p + v.size() * sizeof(T));
  }
  static std::vector<uint8_t> bytes_of(const StateBlock& b) {
    return std::vector<uint8_t>(b.data(), b.data() + b.bytes());
  }
  // earlier (+) later.
  static std::vector<uint8_t> combined(const std::vector<uint8_t>& earlier,
                                       std::vector<uint8_t> later, const StateBlock& b) {
    combine_states(earlier.data(), later.data(), b.heads(), b.record_bytes());
    return later;
  }
  template <class T>
  void sum(T* data, int64_t n) {
    const auto all =
        group_.exchange(rank_, std::vector<uint8_t>(reinterpret_cast<uint8_t*>(data),
                                                    reinterpret_cast<uint8_t*>(data + n)));
    for (int64_t i = 0; i < n; ++i) {
      T s = 0;
      for (const auto& slot : all) s += reinterpret_cast<const T*>(slot.data())[i];
      data[i] = s;
    }
  }
  ThreadGroup& group_;
  int rank_;
};

/// Runs fn(exchange) on `ranks` threads, one per rank; rethrows nothing: fn records results.
inline void run_ranks(int ranks, const std::function<void(ThreadExchange&)>& fn) {
  ThreadGroup group(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&group, &fn, r] {
      ThreadExchange ex(group, r);
      fn(ex);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace favor::testing
