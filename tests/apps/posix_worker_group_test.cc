#include "apps/dtrun/posix_worker_group.h"

#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Real children of /bin/sh, their output in files under a folder of the test's.
class PosixWorkerGroupTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = *os::MakeTempDir("posix-worker-group-test-"); }
  void TearDown() override {
    for (int pid : started_)
      kill(-pid, SIGKILL);  // unreaped: what a failed test left
    while (!group_.Reap().empty()) {
    }
    os::RemoveTree(dir_);
  }

  Result<int> Sh(int local_rank, const std::string& script) {
    WorkerSpec spec;
    spec.local_rank = local_rank;
    spec.argv = {"/bin/sh", "-c", script};
    spec.env = {"PATH=/usr/bin:/bin", "GREETING=hello"};
    spec.out.file = dir_ + "/" + std::to_string(local_rank) + ".out";
    spec.err.file = dir_ + "/" + std::to_string(local_rank) + ".err";
    auto pid = group_.Spawn(spec);
    if (pid.ok()) started_.push_back(*pid);
    return pid;
  }
  // Reaps until `n` workers exited or 10 s passed.
  std::vector<WorkerExit> ReapAll(size_t n) {
    std::vector<WorkerExit> out;
    auto until = steady_clock::now() + std::chrono::seconds(10);
    while (out.size() < n && steady_clock::now() < until) {
      for (const WorkerExit& e : group_.Reap()) {
        out.push_back(e);
        started_.erase(std::remove(started_.begin(), started_.end(), e.pid),
                       started_.end());
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    return out;
  }

  std::string dir_;
  PosixWorkerGroup group_;
  std::vector<int> started_;
};

TEST_F(PosixWorkerGroupTest,
       RunsAWorkerWithItsEnvironmentAndForwardsItsOutput) {
  ASSERT_TRUE(Sh(3, "echo $GREETING; echo oops >&2; exit 5").ok());
  auto exits = ReapAll(1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].local_rank, 3);
  EXPECT_EQ(exits[0].exit_code, 5);
  group_.Drain(milliseconds(2000));
  EXPECT_EQ(os::ReadFileOrEmpty(dir_ + "/3.out"), "hello\n");
  EXPECT_EQ(os::ReadFileOrEmpty(dir_ + "/3.err"), "oops\n");
  EXPECT_TRUE(group_.output_fds().empty());
}

// A descriptor dtrun holds open without close-on-exec (asio's sockets are
// such) is not the worker's: only its standard streams are.
TEST_F(PosixWorkerGroupTest, AWorkerInheritsOnlyItsStandardStreams) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);  // no O_CLOEXEC, as an asio socket
  ASSERT_EQ(dup2(p[0], 77), 77);
  ASSERT_TRUE(Sh(0,
                 "if [ -e /proc/$$/fd/77 ]; then echo leaked; fi; "
                 "[ -e /proc/$$/fd/2 ] && echo has-stderr")
                  .ok());
  auto exits = ReapAll(1);
  close(77);
  close(p[0]);
  close(p[1]);
  ASSERT_EQ(exits.size(), 1u);
  group_.Drain(milliseconds(2000));
  EXPECT_EQ(os::ReadFileOrEmpty(dir_ + "/0.out"), "has-stderr\n");
}

TEST_F(PosixWorkerGroupTest, AProgramThatCannotRunIsAnErrorNamingIt) {
  WorkerSpec spec;
  spec.argv = {dir_ + "/no-such-program"};
  auto pid = group_.Spawn(spec);
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().message().find("cannot execute '" + dir_ +
                                        "/no-such-program'"),
            std::string::npos)
      << pid.status().message();
  auto exits = ReapAll(1);  // the child that failed to exec is still reaped
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].exit_code, 127);
}

TEST_F(PosixWorkerGroupTest, ASignalReachesTheWorkersChildrenToo) {
  // The worker starts a grandchild that writes its pid, then both sleep.
  std::string pidfile = dir_ + "/grandchild";
  auto pid = Sh(0, "sh -c 'echo $$ > " + pidfile + ".tmp; mv " + pidfile +
                       ".tmp " + pidfile + "; sleep 30' & sleep 30");
  ASSERT_TRUE(pid.ok());
  auto until = steady_clock::now() + std::chrono::seconds(10);
  while (os::ReadFileOrEmpty(pidfile).empty() && steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  int grandchild = std::atoi(os::ReadFileOrEmpty(pidfile).c_str());
  ASSERT_GT(grandchild, 0);
  group_.Signal(*pid, SIGTERM);
  auto exits = ReapAll(1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].signal, SIGTERM);
  until = steady_clock::now() + std::chrono::seconds(10);
  while (kill(grandchild, 0) == 0 && steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_NE(kill(grandchild, 0), 0)
      << "the grandchild outlived its group's SIGTERM";
}

TEST_F(PosixWorkerGroupTest, ToolsThatOutliveTheirLimitAreKilled) {
  auto start = steady_clock::now();
  group_.RunTools(
      {ToolRun{{"/bin/sh", "-c", "echo quick"}, dir_ + "/quick.txt"},
       ToolRun{{"/bin/sleep", "30"}, dir_ + "/slow.txt"}},
      milliseconds(300));
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(os::ReadFileOrEmpty(dir_ + "/quick.txt"), "quick\n");
}

}  // namespace
}  // namespace dtrun::agent
