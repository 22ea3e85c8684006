#include "lib/parallel/shm_allreduce.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace dtrun::train {
namespace {

std::string UniqueName() {
  return "/dtrun-test-" + std::to_string(getpid()) + "-" +
         std::to_string(std::random_device{}());
}

// Runs fn(rank) in `world` forked processes (rank 0 creates the segment
// first); returns how many of them failed.
template <typename Fn>
int InProcesses(int world, size_t floats, Fn fn) {
  const std::string name = UniqueName();
  auto owner = ShmAllreduce::Create(name, world, floats);
  if (!owner.ok()) {
    ADD_FAILURE() << owner.status().message();
    return world;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      std::unique_ptr<ShmAllreduce> mine;
      if (r == 0) {
        mine = std::move(*owner);
      } else {
        auto opened = ShmAllreduce::Open(name, r, world, floats);
        if (!opened.ok()) _exit(3);
        mine = std::move(*opened);
      }
      _exit(fn(*mine) ? 0 : 1);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  (*owner)->Unlink();
  return failed;
}

TEST(ShmAllreduceTest, SumsEveryRanksValuesIntoEachRegion) {
  constexpr size_t kFloats = 100003;  // not a multiple of the world size
  for (int world : {1, 2, 3, 4}) {
    int failed = InProcesses(world, kFloats, [&](ShmAllreduce& s) {
      for (int round = 0; round < 3; ++round) {
        float* x = s.region();
        for (size_t i = 0; i < kFloats; ++i)
          x[i] = float((s.rank() + 1) * (i % 97) + round);
        // Two ranges in turn, as DDP's buckets.
        if (!s.Allreduce(0, 40000, std::chrono::seconds(20)).ok()) return false;
        if (!s.Allreduce(40000, kFloats - 40000, std::chrono::seconds(20)).ok())
          return false;
        const float ranks_sum = world * (world + 1) / 2.0f;
        for (size_t i = 0; i < kFloats; ++i) {
          if (x[i] != ranks_sum * float(i % 97) + world * round) return false;
        }
      }
      return true;
    });
    EXPECT_EQ(failed, 0) << "world " << world;
  }
}

// DDP's mean: the division in the all-reduce's pass gives the bits of the
// sum divided afterwards, on every rank.
TEST(ShmAllreduceTest, TheDivisorGivesTheMeanWithTheBitsOfDividingTheSum) {
  constexpr size_t kFloats = 30011;
  for (int world : {2, 3}) {
    int failed = InProcesses(world, kFloats, [&](ShmAllreduce& s) {
      auto value = [](int r, size_t i) {
        return 1.0f / float(r + 7) + float(i % 83) * 0.37f;
      };
      float* x = s.region();
      for (size_t i = 0; i < kFloats; ++i) x[i] = value(s.rank(), i);
      if (!s.Allreduce(0, kFloats, std::chrono::seconds(20)).ok()) return false;
      std::vector<float> mean(x, x + kFloats);
      for (float& m : mean) m /= float(world);
      for (size_t i = 0; i < kFloats; ++i) x[i] = value(s.rank(), i);
      if (!s.Allreduce(0, kFloats, std::chrono::seconds(20), float(world)).ok())
        return false;
      return std::memcmp(x, mean.data(), kFloats * sizeof(float)) == 0;
    });
    EXPECT_EQ(failed, 0) << "world " << world;
  }
}

// FSDP's collectives: each rank's shard of n floats gathered in rank order;
// each rank's chunk of everyone's n * world floats summed in rank order,
// with the same bits as Allreduce's sum of the same values.
TEST(ShmAllreduceTest, AllGathersAndReduceScattersInRankOrder) {
  constexpr size_t kShard = 5003;
  for (int world : {1, 2, 3, 4}) {
    const size_t total = kShard * static_cast<size_t>(world);
    int failed = InProcesses(world, total, [&](ShmAllreduce& s) {
      auto value = [](int r, size_t i) {
        return 1.0f / float(r + 3) + float(i % 89) * 0.1f;
      };
      std::vector<float> gathered(total), mine(kShard), summed(total);
      for (size_t i = 0; i < kShard; ++i) s.region()[i] = value(s.rank(), i);
      if (!s.AllGather(kShard, gathered.data(), std::chrono::seconds(20)).ok())
        return false;
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < kShard; ++i) {
          if (gathered[r * kShard + i] != value(r, i)) return false;
        }
      }
      for (size_t i = 0; i < total; ++i) s.region()[i] = value(s.rank(), i);
      if (!s.ReduceScatter(kShard, mine.data(), std::chrono::seconds(20)).ok())
        return false;
      // and the all-reduce of the same values, for its bits
      for (size_t i = 0; i < total; ++i) s.region()[i] = value(s.rank(), i);
      if (!s.Allreduce(0, total, std::chrono::seconds(20)).ok()) return false;
      std::memcpy(summed.data(), s.region(), total * sizeof(float));
      const size_t lo = kShard * static_cast<size_t>(s.rank());
      return std::memcmp(mine.data(), summed.data() + lo,
                         kShard * sizeof(float)) == 0;
    });
    EXPECT_EQ(failed, 0) << "world " << world;
  }
}

TEST(ShmAllreduceTest, ARankThatNeverComesIsATimeoutNamingIt) {
  int failed = InProcesses(2, 16, [](ShmAllreduce& s) {
    if (s.rank() == 1) return true;  // never calls Allreduce
    Status st = s.Allreduce(0, 16, std::chrono::milliseconds(300));
    return st.code() == Status::Code::kTimeout &&
           st.message().find("local rank(s) 1") != std::string::npos;
  });
  EXPECT_EQ(failed, 0);
}

// In-place recovery waits on this: a rank whose process is gone ends the
// wait at once (well before the timeout), named with its pid.
TEST(ShmAllreduceTest, ARankThatDiedEndsTheWaitNamingIt) {
  const std::string name = UniqueName();
  auto owner = ShmAllreduce::Create(name, 2, 16);
  ASSERT_TRUE(owner.ok()) << owner.status().message();
  pid_t pid = fork();
  if (pid == 0) {
    auto opened = ShmAllreduce::Open(name, 1, 2, 16);
    _exit(opened.ok() ? 0 : 3);  // dies without calling Allreduce
  }
  int status = 0;
  waitpid(pid, &status, 0);  // reaped: gone, not a zombie
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const auto start = std::chrono::steady_clock::now();
  Status st = (*owner)->Allreduce(0, 16, std::chrono::seconds(30));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(st.code(), Status::Code::kUnavailable);
  EXPECT_NE(
      st.message().find("local rank 1 (pid " + std::to_string(pid) + ") died"),
      std::string::npos)
      << st.message();
  (*owner)->Unlink();
}

TEST(ShmAllreduceTest, OpenRefusesAMismatchedOrMissingSegment) {
  const std::string name = UniqueName();
  auto owner = ShmAllreduce::Create(name, 2, 64);
  ASSERT_TRUE(owner.ok());
  EXPECT_FALSE(ShmAllreduce::Open(name, 1, 2, 128).ok());  // other size
  EXPECT_FALSE(ShmAllreduce::Open(name, 1, 3, 64).ok());   // other world
  EXPECT_TRUE(ShmAllreduce::Open(name, 1, 2, 64).ok());
  (*owner)->Unlink();
  EXPECT_FALSE(ShmAllreduce::Open(name, 1, 2, 64).ok());
  EXPECT_FALSE(ShmAllreduce::Create(name, 0, 64).ok());
}

}  // namespace
}  // namespace dtrun::train
