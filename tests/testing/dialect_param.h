#pragma once
// The store tests' parameter over both wire dialects, named in test names
// as Torch113 and Torch2.

#include <gtest/gtest.h>

#include <string>

#include "rendezvous/wire.h"

namespace dtrun::testing {

inline ::testing::internal::ParamGenerator<rendezvous::Dialect> BothDialects() {
  return ::testing::Values(rendezvous::Dialect::kTorch113,
                           rendezvous::Dialect::kTorch2);
}

inline std::string DialectName(
    const ::testing::TestParamInfo<rendezvous::Dialect>& info) {
  return info.param == rendezvous::Dialect::kTorch2 ? "Torch2" : "Torch113";
}

}  // namespace dtrun::testing
