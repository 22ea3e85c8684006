#pragma once
// Timing and memory figures shared by the multi-rank benchmarks and tests.

#include <sys/resource.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <chrono>
#include <vector>

#include "lib/torch_compat.h"

namespace dtrun::testing {

// Median wall time of fn() over `reps` calls after `warmup` calls, in ms.
template <typename Fn>
double MedianMs(int warmup, int reps, Fn fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - a)
                    .count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// This process's peak resident set, MB.
inline double PeakRssMb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

// The largest `v` over the ranks of `pg` (collective).
inline double AllMax(dtrun::train::ProcessGroup& pg, double v) {
  std::vector<at::Tensor> t{at::tensor({v}, at::kDouble)};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  pg.allreduce(t, o)->wait();
  return t[0].item<double>();
}

}  // namespace dtrun::testing
