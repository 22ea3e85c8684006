#include "apps/dtrun/file_timer.h"

#include <gtest/gtest.h>

namespace dtrun::agent {
namespace {

TimerRequest Req(int pid, const std::string& scope, double t, int sig = 9) {
  return TimerRequest{pid, scope, t, sig};
}

TEST(FileTimerTest, ParsesTorchsRequestLine) {
  std::string error;
  auto r = ParseTimerRequest(
      R"({"version": 1, "pid": 42, "scope_id": "w.py#12", "expiration_time": 1700000000.5, "signal": 9})",
      &error);
  ASSERT_TRUE(r.has_value()) << error;
  EXPECT_EQ(r->pid, 42);
  EXPECT_EQ(r->scope_id, "w.py#12");
  EXPECT_DOUBLE_EQ(r->expiration_time, 1700000000.5);
  EXPECT_EQ(r->signal, 9);
  EXPECT_FALSE(ParseTimerRequest("{\"pid\": 1}", &error).has_value());
  EXPECT_NE(error.find("not a FileTimerRequest"), std::string::npos);
  EXPECT_FALSE(ParseTimerRequest("garbage", &error).has_value());
}

TEST(FileTimerTest,
     ExpiresPerPidWithTheEarliestSignalledScopeAndClearsThatPid) {
  FileTimers timers;
  timers.Register(Req(1, "a", 10, 0));
  timers.Register(Req(1, "b", 11, 9));
  timers.Register(Req(2, "c", 20));
  EXPECT_EQ(timers.next_expiry(), 10);
  EXPECT_TRUE(timers.Reap(9.9).empty());
  auto e = timers.Reap(12);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].pid, 1);
  EXPECT_EQ(e[0].scope_id, "b");  // "a" has no signal
  EXPECT_EQ(e[0].signal, 9);
  EXPECT_EQ(timers.next_expiry(), 20);  // pid 1's timers are gone
}

TEST(FileTimerTest, ANegativeExpirationReleasesTheScope) {
  FileTimers timers;
  timers.Register(Req(1, "a", 10));
  timers.Register(Req(1, "a", -1, 0));
  EXPECT_FALSE(timers.next_expiry().has_value());
  EXPECT_TRUE(timers.Reap(100).empty());
}

}  // namespace
}  // namespace dtrun::agent
