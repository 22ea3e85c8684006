// The async checkpoint writer: one write in flight, its outcome and timing
// handed to the next Wait, none lost at destruction.
#include "lib/checkpointing/async_save.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

namespace dtrun::train {
namespace {

TEST(AsyncSaveTest, WaitWithNothingInFlightReturnsAtOnce) {
  AsyncSave saver;
  AsyncSave::Finished f = saver.Wait();
  EXPECT_EQ(f.step, -1);
  EXPECT_TRUE(f.status.ok());
  EXPECT_FALSE(saver.in_flight());
}

TEST(AsyncSaveTest, TheWriteRunsOffTheCallersThreadAndItsStatusComesBack) {
  AsyncSave saver;
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  saver.Start(50, [go] {
    go.wait();  // blocked until the test lets it finish
    return Status::Io("disk full");
  });
  EXPECT_TRUE(saver.in_flight());
  EXPECT_TRUE(saver.running());  // Start returned while the write waits
  release.set_value();
  AsyncSave::Finished f = saver.Wait();
  EXPECT_EQ(f.step, 50);
  EXPECT_EQ(f.status.code(), Status::Code::kIo);
  EXPECT_EQ(f.status.message(), "disk full");
  EXPECT_FALSE(saver.in_flight());
  EXPECT_EQ(saver.Wait().step, -1);  // reported once
}

TEST(AsyncSaveTest, WaitSaysHowLongItBlocked) {
  AsyncSave saver;
  saver.Start(7, [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return Status::Ok();
  });
  AsyncSave::Finished f = saver.Wait();
  EXPECT_TRUE(f.status.ok());
  EXPECT_GE(f.write_s, 0.045);
  EXPECT_GT(f.waited_s, 0.0);
  EXPECT_LE(f.waited_s, f.write_s + 0.5);
}

TEST(AsyncSaveTest, DestructionWaitsForTheWrite) {
  std::atomic<bool> written{false};
  {
    AsyncSave saver;
    saver.Start(1, [&written] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      written = true;
      return Status::Ok();
    });
  }
  EXPECT_TRUE(written);
}

TEST(AsyncSaveDeathTest, StartingASecondWriteInFlightIsABug) {
  AsyncSave saver;
  saver.Start(1, [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return Status::Ok();
  });
  EXPECT_DEATH(saver.Start(2, [] { return Status::Ok(); }), "in flight");
  saver.Wait();
}

}  // namespace
}  // namespace dtrun::train
