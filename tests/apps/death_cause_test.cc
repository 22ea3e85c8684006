#include "apps/dtrun/death_cause.h"

#include <signal.h>

#include <gtest/gtest.h>

namespace dtrun::agent {
namespace {

std::vector<KmsgRecord> Records(const std::vector<std::string>& raw) {
  std::vector<KmsgRecord> out;
  for (const std::string& r : raw) out.push_back(*ParseKmsgRecord(r));
  return out;
}

TEST(KmsgRecordTest, ParsesTheHeadAndDropsKeyValueLines) {
  auto r = ParseKmsgRecord(
      "3,1234,5012345,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU off the bus\n"
      " SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->seq, 1234u);
  EXPECT_DOUBLE_EQ(r->uptime_s, 5.012345);
  EXPECT_EQ(r->text, "NVRM: Xid (PCI:0000:3b:00): 79, GPU off the bus");
  EXPECT_FALSE(ParseKmsgRecord("no header here").has_value());
  EXPECT_FALSE(ParseKmsgRecord("x,y;text").has_value());
}

TEST(OomKillTest, FindsTheKillOfThisPidWithItsCgroup) {
  auto records = Records({
      "4,10,100,-;python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL)",
      "6,11,101,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
      "cpuset=/,mems_allowed=0,oom_memcg=/jobs/a,task_memcg=/jobs/a,"
      "task=python3,pid=20800,uid=0",
      "3,12,102,-;Memory cgroup out of memory: Killed process 20800 (python3) "
      "total-vm:324052kB, anon-rss:305920kB, file-rss:2048kB, shmem-rss:0kB, "
      "UID:0 pgtables:700kB oom_score_adj:0",
  });
  auto k = FindOomKill(records, 20800);
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->process, "python3");
  EXPECT_EQ(k->total_vm_kb, 324052);
  EXPECT_EQ(k->anon_rss_kb, 305920);
  EXPECT_EQ(k->memcg, "/jobs/a");
  EXPECT_TRUE(k->cgroup_limit);
  // Another pid's kill is not this one's, nor a pid that merely starts the
  // same ("208" of "20800").
  EXPECT_FALSE(FindOomKill(records, 208).has_value());
  EXPECT_FALSE(FindOomKill(records, 1).has_value());
}

TEST(OomKillTest, AHostWideOomHasNoCgroup) {
  auto k =
      FindOomKill(Records({"3,1,1,-;Out of memory: Killed process 7 (train) "
                           "total-vm:1000kB, anon-rss:900kB, file-rss:0kB"}),
                  7);
  ASSERT_TRUE(k.has_value());
  EXPECT_FALSE(k->cgroup_limit);
  EXPECT_EQ(k->memcg, "");
  EXPECT_EQ(DescribeOomKill(&*k, "", -1, -1),
            "killed by the kernel's OOM killer (the host ran out of memory; "
            "anon-rss 1 MB at the kill)");
}

TEST(OomKillTest, DescribesWhatWasRead) {
  OomKill k;
  k.anon_rss_kb = 299 * 1024;
  k.memcg = "/jobs/a";
  k.cgroup_limit = true;
  EXPECT_EQ(DescribeOomKill(&k, "/ignored", 300LL << 20, 280),
            "killed by the kernel's OOM killer (memory cgroup /jobs/a: limit "
            "300 MB; anon-rss 299 MB at the kill; peak RSS 280 MB as dtrun "
            "saw it)");
  // The counter alone (no kernel log): the cgroup dtrun read.
  EXPECT_EQ(DescribeOomKill(nullptr, "/jobs/b", -1, -1),
            "killed by the kernel's OOM killer (memory cgroup /jobs/b)");
}

TEST(XidTest, QuotesEachXidWithTheMeaningOfTheCommonOnes) {
  auto xids = FindXids(Records({
      "4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=12, GPU has fallen off",
      "6,2,2,-;eth0: link up",
      "4,3,3,-;NVRM: Xid (PCI:0000:3c:00): 1234, something new",
  }));
  ASSERT_EQ(xids.size(), 2u);
  EXPECT_EQ(xids[0].code, 79);
  EXPECT_EQ(DescribeXid(xids[0]),
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=12, GPU has fallen off (Xid "
            "79: the GPU has fallen off the bus; drain the node and have it "
            "serviced)");
  EXPECT_EQ(DescribeXid(xids[1]), xids[1].text);  // unknown: as logged
  for (int code : {13, 31, 43, 48, 63, 64, 74, 79, 94, 95})
    EXPECT_NE(XidMeaning(code), "") << code;
}

TEST(MemoryCgroupTest, ReadsV1AndV2) {
  EXPECT_EQ(MemoryCgroupDir("4:memory:/jobs/a\n0::/\n", "/sys/fs/cgroup"),
            "/sys/fs/cgroup/memory/jobs/a");
  EXPECT_EQ(MemoryCgroupDir("5:cpu,memory:/\n", "/r"), "/r/memory");
  EXPECT_EQ(MemoryCgroupDir("0::/user.slice/job\n", "/sys/fs/cgroup"),
            "/sys/fs/cgroup/user.slice/job");
  EXPECT_EQ(MemoryCgroupDir("", "/r"), "");
  EXPECT_EQ(ParseOomKillCount("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
            3);
  EXPECT_EQ(ParseOomKillCount("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n"), 1);
  EXPECT_EQ(ParseOomKillCount("low 0\n"), -1);
  EXPECT_EQ(ParseMemoryLimit("314572800\n"), 314572800);
  EXPECT_EQ(ParseMemoryLimit("max\n"), -1);
  EXPECT_EQ(ParseMemoryLimit("9223372036854771712"), -1);  // v1: no limit
}

TEST(FatalSignalTest, SaysTheMeaningAndWhereTheCoreWent) {
  EXPECT_NE(SignalMeaning(SIGSEGV).find("invalid memory access"),
            std::string::npos);
  for (int s : {SIGBUS, SIGILL, SIGABRT, SIGFPE})
    EXPECT_NE(SignalMeaning(s), "");
  EXPECT_EQ(SignalMeaning(SIGTERM), "");
  EXPECT_EQ(DescribeCore(false, "core", 0, ""),
            "no core dumped (ulimit -c is 0: run `ulimit -c unlimited` before "
            "dtrun to keep one)");
  EXPECT_EQ(DescribeCore(true, "|/lib/systemd/systemd-coredump %P %u", -1, ""),
            "core piped to /lib/systemd/systemd-coredump (coredumpctl list "
            "shows it)");
  EXPECT_EQ(DescribeCore(true, "core", -1, "core.42"),
            "core dumped to core.42");
}

}  // namespace
}  // namespace dtrun::agent
