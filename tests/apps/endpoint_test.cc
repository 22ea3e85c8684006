#include "apps/dtrun/endpoint.h"

#include <gtest/gtest.h>

#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

TEST(EndpointTest, SplitsHostAndPort) {
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(SplitEndpoint("node3:29401", 29400, &host, &port));
  EXPECT_EQ(host, "node3");
  EXPECT_EQ(port, 29401);
  ASSERT_TRUE(SplitEndpoint("node3", 29400, &host, &port));
  EXPECT_EQ(port, 29400);
  ASSERT_TRUE(SplitEndpoint("[fe80::1]:7", 29400, &host, &port));
  EXPECT_EQ(host, "fe80::1");
  EXPECT_EQ(port, 7);
}

TEST(EndpointTest, RejectsWhatIsNotHostPort) {
  std::string host;
  uint16_t port = 0;
  EXPECT_FALSE(SplitEndpoint("", 1, &host, &port));
  EXPECT_FALSE(SplitEndpoint("node:70000", 1, &host, &port));
  EXPECT_FALSE(SplitEndpoint("node:x", 1, &host, &port));
  EXPECT_FALSE(SplitEndpoint("[::1", 1, &host, &port));
  EXPECT_FALSE(SplitEndpoint(":80", 1, &host, &port));
}

TEST(EndpointTest, KnowsThisHost) {
  EXPECT_TRUE(IsThisHost("localhost"));
  EXPECT_TRUE(IsThisHost("127.0.0.3"));
  EXPECT_TRUE(IsThisHost(os::HostName()));
  EXPECT_FALSE(IsThisHost("192.0.2.1"));  // TEST-NET-1: documentation only
}

}  // namespace
}  // namespace dtrun::agent
