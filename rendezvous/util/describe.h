#pragma once

// Formatters for error messages, shared by the stores and the rendezvous so
// every message spells keys and durations the same way. Pure and thread-safe.

#include <chrono>
#include <string>
#include <vector>

namespace dtrun::rendezvous {

// "[a, b, c]"; past four keys the first three and "... N more", so a
// MULTI_GET of 48 keys still fits on one log line.
std::string DescribeKeys(const std::vector<std::string>& keys);

// Seconds with two decimals: "1.50s".
std::string DescribeSeconds(std::chrono::nanoseconds d);

}  // namespace dtrun::rendezvous
