#pragma once
// One c10d request's bytes, for the benchmarks that drive raw connections
// (store_load_bench, store_bench, fanin_bench).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/wire.h"

namespace dtrun::testing {

inline std::string EncodeFrame(rendezvous::Dialect dialect, rendezvous::Op op,
                               std::vector<std::string> keys,
                               std::vector<std::string> values = {},
                               int64_t number = 0) {
  rendezvous::Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.number = number;
  std::string out;
  rendezvous::EncodeRequest(r, dialect, &out);
  return out;
}

}  // namespace dtrun::testing
