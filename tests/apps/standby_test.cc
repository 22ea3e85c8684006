#include "apps/dtrun/standby.h"

#include <gtest/gtest.h>

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;

// A restarted worker's wait for a standby still starting blocks dtrun's
// loop: alone it may be long; with peers it stays within the node's beats.
TEST(StandbyWaitTest, AloneLongWithPeersWithinHalfTheKeepAlive) {
  LaunchConfig config;
  EXPECT_EQ(StandbyWait(config), milliseconds(20000));
  config.max_nodes = 2;
  EXPECT_EQ(StandbyWait(config), milliseconds(500));  // the default 1 s
  config.rdzv_conf.keep_alive_interval = milliseconds(5000);
  EXPECT_EQ(StandbyWait(config), milliseconds(2500));
  config.rdzv_conf.keep_alive_interval = milliseconds(120000);
  EXPECT_EQ(StandbyWait(config), milliseconds(20000));
}

}  // namespace
}  // namespace dtrun::agent
