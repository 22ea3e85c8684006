// The metrics and health server's request reader: pure, bounded.
#include "apps/dtrun/http_request.h"

#include <gtest/gtest.h>

namespace dtrun::agent {
namespace {

using State = HttpRequest::State;

TEST(HttpRequestTest, ARequestLineAndHeaders) {
  auto r = ParseHttpRequest("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.state, State::kComplete);
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.path, "/metrics");
  r = ParseHttpRequest("HEAD /readyz?verbose=1 HTTP/1.0\n\n");
  EXPECT_EQ(r.state, State::kComplete);
  EXPECT_EQ(r.method, "HEAD");
  EXPECT_EQ(r.path, "/readyz");  // the query is not the path
}

TEST(HttpRequestTest, IncompleteUntilTheBlankLine) {
  EXPECT_EQ(ParseHttpRequest("").state, State::kIncomplete);
  EXPECT_EQ(ParseHttpRequest("GET /metrics HTTP/1.1\r\n").state,
            State::kIncomplete);
}

TEST(HttpRequestTest, MalformedLinesAndOversizedHeads) {
  for (const char* bad :
       {"GET\r\n\r\n", "GET /metrics\r\n\r\n", "get /metrics HTTP/1.1\r\n\r\n",
        "GET metrics HTTP/1.1\r\n\r\n", "GET /metrics FTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1 x\r\n\r\n", " /metrics HTTP/1.1\r\n\r\n"}) {
    EXPECT_EQ(ParseHttpRequest(bad).state, State::kMalformed) << bad;
  }
  std::string huge = "GET /" + std::string(kMaxRequestHead, 'a');
  EXPECT_EQ(ParseHttpRequest(huge).state, State::kMalformed);
  EXPECT_EQ(ParseHttpRequest(huge + " HTTP/1.1\r\n\r\n").state,
            State::kMalformed);
}

}  // namespace
}  // namespace dtrun::agent
