#include "apps/dtrun/worker_env.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

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
  EXPECT_EQ(
      WorkerEnv({{"OMP_NUM_THREADS", "6"}}, Attempt(), many)["OMP_NUM_THREADS"],
      "6");
}

TEST(WorkerEnvTest, NcclAsyncErrorHandlingKeepsUserValue) {
  WorkerPlace p;
  EnvMap env = WorkerEnv({{"NCCL_ASYNC_ERROR_HANDLING", "0"}}, Attempt(), p);
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "0");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  env = WorkerEnv({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}, Attempt(), p);
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "3");
}

// torch >= 2.2 warns "NCCL_ASYNC_ERROR_HANDLING is deprecated" whenever the
// old name is set: dtrun sets only the new one, as torchrun >= 2.2 does.
TEST(WorkerEnvTest, TheDeprecatedNcclNameIsNotAdded) {
  EnvMap env = WorkerEnv({}, Attempt(), WorkerPlace{});
  EXPECT_EQ(env.count("NCCL_ASYNC_ERROR_HANDLING"), 0u);
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
}

TEST(TorchShimTest, GoesFirstOnPythonPathKeepingTheUsersEntries) {
  EnvMap env = WithTorchShim({{"PYTHONPATH", "/a:/b"}}, "/run/python");
  EXPECT_EQ(env["PYTHONPATH"], "/run/python:/a:/b");
  EXPECT_EQ(env["DTRUN_TORCH_SHIM_DIR"], "/run/python");
  EXPECT_EQ(WithTorchShim({}, "/run/python")["PYTHONPATH"], "/run/python");
}

TEST(TorchShimTest, OffWhenTurnedOffOrAlreadyThere) {
  EXPECT_TRUE(WantsTorchShim({}));
  EXPECT_TRUE(WantsTorchShim({{"DTRUN_TORCH_SHIM", "1"}}));
  EXPECT_FALSE(WantsTorchShim({{"DTRUN_TORCH_SHIM", "0"}}));
  EXPECT_FALSE(WantsTorchShim(WithTorchShim({{"PYTHONPATH", "/a"}}, "/s")));
  // A stale folder no longer on PYTHONPATH does not count.
  EXPECT_TRUE(WantsTorchShim(
      {{"DTRUN_TORCH_SHIM_DIR", "/s"}, {"PYTHONPATH", "/a:/s2"}}));
}

TEST(TorchShimTest, InstallWritesTheSitecustomizeOnce) {
  char templ[] = "/tmp/worker_env_test-XXXXXX";
  ASSERT_NE(mkdtemp(templ), nullptr);
  std::string dir = std::string(templ) + "/python";
  EnvMap env = {{"PYTHONPATH", "/user"}};
  ASSERT_TRUE(InstallTorchShim(dir, &env).ok());
  EXPECT_EQ(env["PYTHONPATH"], dir + ":/user");
  std::ifstream in(dir + "/sitecustomize.py");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("DTRUN_TORCH_SHIM"), std::string::npos);
  EnvMap again = env;
  ASSERT_TRUE(InstallTorchShim(dir + "2", &again).ok());
  EXPECT_EQ(again, env);  // already there: nothing added
  EnvMap off = {{"DTRUN_TORCH_SHIM", "0"}};
  ASSERT_TRUE(InstallTorchShim(dir + "3", &off).ok());
  EXPECT_EQ(off.count("PYTHONPATH"), 0u);
  EXPECT_NE(access((dir + "3").c_str(), F_OK), 0);
  EnvMap fresh;
  Status bad = InstallTorchShim("/proc/no/such/dir", &fresh);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("/proc/no/such/dir"), std::string::npos)
      << bad.message();
  EXPECT_EQ(fresh.count("PYTHONPATH"), 0u);
  std::remove((dir + "/sitecustomize.py").c_str());
  rmdir(dir.c_str());
  rmdir(templ);
}

}  // namespace
}  // namespace dtrun::agent
