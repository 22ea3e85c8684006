#pragma once

// The head of an HTTP request, as the metrics and health server reads it:
// bounded, and pure so that it is fuzzed (tests/fuzz/http_fuzz.cc). Only
// the request line matters to the server; headers are skipped.

#include <cstddef>
#include <string>
#include <string_view>

namespace dtrun::agent {

// The most a request's head may take; past it the request is malformed.
constexpr size_t kMaxRequestHead = 8192;

struct HttpRequest {
  enum class State { kIncomplete, kMalformed, kComplete };
  State state = State::kIncomplete;
  std::string method;  // "GET", "HEAD", ...: as sent
  std::string path;    // without the query string: "/metrics"
};

// Reads `bytes` (what the connection sent so far). kIncomplete until the
// blank line that ends the head; kMalformed for a request line that is not
// "METHOD SP TARGET SP HTTP/x.y", a target that is not an absolute path,
// or a head longer than kMaxRequestHead.
HttpRequest ParseHttpRequest(std::string_view bytes);

}  // namespace dtrun::agent
