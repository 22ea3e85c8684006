#include "lib/dist_env.h"

#include <gtest/gtest.h>

namespace dtrun::train {
namespace {

TEST(DistEnvTest, ReadsWhatTheLauncherSets) {
  auto d = ReadDistEnv({{"RANK", "3"},
                        {"WORLD_SIZE", "4"},
                        {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "2"},
                        {"MASTER_ADDR", "10.0.0.1"},
                        {"MASTER_PORT", "29500"},
                        {"TORCHELASTIC_RESTART_COUNT", "2"},
                        {"TORCHELASTIC_RUN_ID", "job"}});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->rank, 3);
  EXPECT_EQ(d->world_size, 4);
  EXPECT_EQ(d->local_rank, 1);
  EXPECT_EQ(d->master_port, 29500);
  EXPECT_EQ(d->restart_count, 2);
  EXPECT_EQ(d->run_id, "job");
}

TEST(DistEnvTest, MissingVariablesSayToUseALauncher) {
  auto d = ReadDistEnv({{"WORLD_SIZE", "2"}});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("RANK is not set"), std::string::npos);
  EXPECT_NE(d.status().message().find("dtrun"), std::string::npos);
}

TEST(DistEnvTest, RankOutsideWorldIsRejected) {
  auto d = ReadDistEnv({{"RANK", "4"},
                        {"WORLD_SIZE", "4"},
                        {"MASTER_ADDR", "h"},
                        {"MASTER_PORT", "1"}});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("RANK='4'"), std::string::npos);
}

}  // namespace
}  // namespace dtrun::train
