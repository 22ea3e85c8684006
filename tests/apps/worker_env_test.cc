#include "apps/dtrun/worker_env.h"

#include <gtest/gtest.h>

namespace dtrun::agent {
namespace {

AttemptEnv Attempt() {
  AttemptEnv a;
  a.role = "trainer";
  a.master_addr = "10.0.0.1";
  a.master_port = 29555;
  a.restart_count = 2;
  a.max_restarts = 3;
  a.run_id = "job7";
  a.error_file_dir = "/logs/attempt_2";
  return a;
}

TEST(WorkerEnvTest, SetsTorchrunsVariables) {
  WorkerPlace p{1, 5, 1, 5, 4, 8, 2, 8};
  EnvMap env = WorkerEnv({{"PATH", "/bin"}}, Attempt(), p);
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["RANK"], "5");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["ROLE_RANK"], "5");
  EXPECT_EQ(env["ROLE_NAME"], "trainer");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["WORLD_SIZE"], "8");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "8");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29555");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "3");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job7");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
  EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], "/logs/attempt_2/1/error.json");
  EXPECT_EQ(env["PATH"], "/bin");
}

TEST(WorkerEnvTest, OmpThreadsDefaultsToOneOnlyForSeveralWorkers) {
  WorkerPlace many{0, 0, 0, 0, 2, 2, 1, 2};
  WorkerPlace one{0, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_EQ(WorkerEnv({}, Attempt(), many)["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(WorkerEnv({}, Attempt(), one).count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(WorkerEnv({{"OMP_NUM_THREADS", "6"}}, Attempt(), many)["OMP_NUM_THREADS"], "6");
}

TEST(WorkerEnvTest, NcclAsyncErrorHandlingKeepsUserValue) {
  WorkerPlace p;
  EnvMap env = WorkerEnv({{"NCCL_ASYNC_ERROR_HANDLING", "0"}}, Attempt(), p);
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "0");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
}

}  // namespace
}  // namespace dtrun::agent
