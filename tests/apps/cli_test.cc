#include "apps/dtrun/cli.h"
#include "apps/dtrun/devices.h"
#include "apps/dtrun/worker_store.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>

namespace dtrun::agent {
namespace {

CliResult Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dtrun");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data());
}

TEST(CliTest, AcceptsDashAndUnderscoreSpellings) {
  auto a = Parse({"--nproc-per-node=3", "--max_restarts", "2", "true"});
  ASSERT_EQ(a.exit_code, std::nullopt);
  EXPECT_EQ(a.config.nproc_per_node, 3);
  EXPECT_EQ(a.config.max_restarts, 2);
  auto b = Parse({"--nproc_per_node", "2", "--max-restarts=1", "true"});
  ASSERT_EQ(b.exit_code, std::nullopt);
  EXPECT_EQ(b.config.nproc_per_node, 2);
}

TEST(CliTest, EverythingAfterTheProgramIsItsOwn) {
  auto a = Parse(
      {"--nproc-per-node=2", "true", "--nproc-per-node=9", "--lr", "0.1"});
  ASSERT_EQ(a.exit_code, std::nullopt);
  EXPECT_EQ(a.config.nproc_per_node, 2);
  EXPECT_EQ(a.config.worker_argv.size(), 4u);
  EXPECT_EQ(a.config.worker_argv[1], "--nproc-per-node=9");
}

TEST(CliTest, PythonScriptsRunUnbufferedThroughPython) {
  auto a = Parse({"--python", "sh", "CMakeLists.txt.py"});
  EXPECT_EQ(a.exit_code, 2);  // not found
  auto m = Parse({"--python", "sh", "-m", "pkg.train", "x"});
  ASSERT_EQ(m.exit_code, std::nullopt);
  EXPECT_EQ(m.config.worker_argv[1], "-u");
  EXPECT_EQ(m.config.worker_argv[2], "-m");
  EXPECT_EQ(m.config.worker_argv[3], "pkg.train");
}

TEST(CliTest, StandbyIsTheProgramItselfOrTorchForPython) {
  auto native = Parse({"--standby", "true"});
  ASSERT_EQ(native.exit_code, std::nullopt);
  EXPECT_TRUE(native.config.standby);
  EXPECT_TRUE(native.config.standby_modules.empty());
  auto py = Parse({"--standby", "--python", "sh", "-m", "pkg.train"});
  ASSERT_EQ(py.exit_code, std::nullopt);
  EXPECT_EQ(py.config.standby_modules,
            (std::vector<std::string>{"torch", "torch.distributed"}));
  auto named = Parse(
      {"--standby", "--standby-import=numpy", "--python", "sh", "-m", "p"});
  ASSERT_EQ(named.exit_code, std::nullopt);
  EXPECT_EQ(named.config.standby_modules, std::vector<std::string>{"numpy"});
  ::testing::internal::CaptureStderr();
  auto wrong = Parse({"--standby-import=torch", "true"});
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(wrong.exit_code, 2);
  EXPECT_NE(err.find("use --standby for a program built on"), std::string::npos)
      << err;
}

TEST(CliTest, BadValuesExitTwo) {
  EXPECT_EQ(Parse({"--nproc-per-node=zero", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--nnodes=3:2", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--redirects=7", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--max-restarts=-1", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--master-port=70000", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--bogus-flag", "true"}).exit_code, 2);
  EXPECT_EQ(
      Parse({"--nproc-per-node=2", "--local-ranks-filter=5", "true"}).exit_code,
      2);
  EXPECT_EQ(Parse({"--no-python", "-m", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"no-such-program-anywhere"}).exit_code, 2);
  EXPECT_EQ(Parse({}).exit_code, 2);
}

TEST(CliTest, HelpExitsZero) { EXPECT_EQ(Parse({"--help"}).exit_code, 0); }

TEST(CliTest, PetEnvironmentFillsUnsetFlags) {
  setenv("PET_NPROC_PER_NODE", "4", 1);
  auto a = Parse({"true"});
  auto b = Parse({"--nproc-per-node=2", "true"});
  unsetenv("PET_NPROC_PER_NODE");
  EXPECT_EQ(a.config.nproc_per_node, 4);
  EXPECT_EQ(b.config.nproc_per_node, 2);
}

// PyTorchJob v1 with an elastic policy sets PET_STANDALONE="" (torchrun
// fails on it: int("")): empty is unset, so the job is not standalone.
TEST(CliTest, AnEmptyPetStandaloneIsUnset) {
  setenv("PET_STANDALONE", "", 1);
  auto empty = Parse({"--nnodes=1:2", "--rdzv-backend=c10d",
                      "--rdzv-endpoint=127.0.0.1:29400", "true"});
  setenv("PET_STANDALONE", "1", 1);
  auto one = Parse({"true"});
  unsetenv("PET_STANDALONE");
  EXPECT_EQ(empty.exit_code, std::nullopt);
  EXPECT_FALSE(empty.config.standalone);
  EXPECT_EQ(empty.config.max_nodes, 2);
  EXPECT_TRUE(one.config.standalone);
}

TEST(CliTest, StreamSpecsAndRendezvousSettingsParse) {
  auto a = Parse({"-r", "3", "-t", "0:1,1:2", "--rdzv-conf",
                  "join_timeout=5,is_host=1", "--nnodes", "1:4",
                  "--local-ranks-filter", "0", "true"});
  ASSERT_EQ(a.exit_code, std::nullopt);
  EXPECT_EQ(a.config.redirects.For(7), 3);
  EXPECT_EQ(a.config.tee.For(1), 2);
  EXPECT_EQ(a.config.tee.For(2), 0);
  EXPECT_EQ(a.config.rdzv_conf.join_timeout, std::chrono::milliseconds(5000));
  EXPECT_EQ(a.config.rdzv_conf.is_host, std::optional<bool>(true));
  EXPECT_EQ(a.config.min_nodes, 1);
  EXPECT_EQ(a.config.max_nodes, 4);
}

TEST(CliTest, BadRendezvousSettingsExitTwoNamingTheKey) {
  ::testing::internal::CaptureStderr();
  auto bad = Parse({"--rdzv-conf", "join_timeout=abc", "true"});
  auto typo = Parse({"--rdzv-conf", "join_timout=60", "true"});
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(err.find("join_timeout='abc' is not a number of seconds"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("unknown key 'join_timout'"), std::string::npos) << err;
}

TEST(CliTest, AnInteractiveSessionUnderSrunHasItsConsoleOnNodeZeroOnly) {
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("SLURM_NNODES", "2", 1);
  setenv("SLURM_JOB_NODELIST", "n[1-2]", 1);
  setenv("SLURM_NODEID", "1", 1);
  auto node1 = Parse({"--interactive", "--nproc-per-node=2"});
  setenv("SLURM_NODEID", "0", 1);
  auto node0 = Parse({"--interactive", "--nproc-per-node=2"});
  for (const char* v :
       {"SLURM_JOB_ID", "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODEID"}) {
    unsetenv(v);
  }
  ASSERT_EQ(node1.exit_code, std::nullopt);
  ASSERT_EQ(node0.exit_code, std::nullopt);
  EXPECT_TRUE(node1.config.no_console);
  EXPECT_FALSE(node0.config.no_console);
  EXPECT_EQ(node1.config.node_rank, 1);
  EXPECT_EQ(node0.config.master_addr, "n1");
}

DeviceCounts Devices(int cpu, int gpu, int xpu = 0) {
  DeviceCounts d;
  d.cpu = cpu;
  d.gpu = gpu;
  d.xpu = xpu;
  return d;
}

TEST(NprocTest, NamedCountsResolve) {
  EXPECT_EQ(*ParseNprocPerNode("cpu", Devices(8, 0)), 8);
  EXPECT_EQ(*ParseNprocPerNode("auto", Devices(8, 0)), 8);
  EXPECT_EQ(*ParseNprocPerNode("auto", Devices(8, 2)), 2);
  EXPECT_EQ(*ParseNprocPerNode("auto", Devices(8, 0, 4)), 4);
  EXPECT_EQ(*ParseNprocPerNode("gpu", Devices(8, 2)), 2);
  EXPECT_EQ(*ParseNprocPerNode("xpu", Devices(8, 0, 3)), 3);
  EXPECT_FALSE(ParseNprocPerNode("gpu", Devices(8, 0)).ok());
  EXPECT_FALSE(ParseNprocPerNode("0", Devices(8, 0)).ok());
  auto xpu = ParseNprocPerNode("xpu", Devices(8, 0));
  ASSERT_FALSE(xpu.ok());
  EXPECT_NE(xpu.status().message().find("no Intel XPU"), std::string::npos);
  auto word = ParseNprocPerNode("tpu", Devices(8, 0));
  ASSERT_FALSE(word.ok());
  EXPECT_NE(word.status().message().find("'tpu'"), std::string::npos);
}

TEST(CliTest, RepeatedFlagsKeepTheLastValue) {
  auto a = Parse({"--role", "a", "--nproc-per-node=2", "--role", "b",
                  "--nproc_per_node", "3", "true"});
  ASSERT_EQ(a.exit_code, std::nullopt);
  EXPECT_EQ(a.config.role, "b");
  EXPECT_EQ(a.config.nproc_per_node, 3);
}

// --status needs no program; its run is optional, so "--json" after it is
// a flag, not the run. Parsing only asks: main answers.
TEST(CliTest, StatusTakesAnOptionalRunAndNeedsNoProgram) {
  auto all = Parse({"--status", "--json"});
  EXPECT_EQ(all.exit_code, std::nullopt);
  EXPECT_EQ(all.query.kind, Query::Kind::kStatus);
  EXPECT_EQ(all.query.target, "");
  EXPECT_TRUE(all.query.json);
  auto one = Parse({"--status", "no-such-run"});
  EXPECT_EQ(one.query.kind, Query::Kind::kStatus);
  EXPECT_EQ(one.query.target, "no-such-run");
  EXPECT_FALSE(one.query.json);
  auto stacks = Parse({"--stacks", "job7"});
  EXPECT_EQ(stacks.exit_code, std::nullopt);
  EXPECT_EQ(stacks.query.kind, Query::Kind::kStacks);
  EXPECT_EQ(stacks.query.target, "job7");
  EXPECT_EQ(Parse({"true"}).query.kind, Query::Kind::kNone);
  ::testing::internal::CaptureStderr();
  auto stray = Parse({"--json", "true"});  // --json alone would be ignored
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(stray.exit_code, 2);
  EXPECT_NE(err.find("--json: only with --status"), std::string::npos) << err;
}

TEST(CliTest, UnambiguousPrefixesAreTheFlag) {
  auto a = Parse(
      {"--nnode=2", "--nproc=2", "--master-ad", "h1", "--node_r", "1", "true"});
  ASSERT_EQ(a.exit_code, std::nullopt);
  EXPECT_EQ(a.config.max_nodes, 2);
  EXPECT_EQ(a.config.nproc_per_node, 2);
  EXPECT_EQ(a.config.master_addr, "h1");
  EXPECT_EQ(a.config.node_rank, 1);
  // --max matches --max-restarts only among torchrun's flags... and dtrun
  // adds none starting so; --m matches five flags.
  EXPECT_EQ(Parse({"--max=2", "true"}).config.max_restarts, 2);
  EXPECT_EQ(Parse({"--m", "2", "true"}).exit_code, 2);
}

TEST(CliTest, DtrunsOwnFlagsNeverMakeATorchrunPrefixAmbiguous) {
  // --no-p is --no-python; "--no-c" is dtrun's --no-console; --log-l could
  // be torchrun's --log-line-prefix-template or dtrun's --log-level.
  auto a = Parse({"--log-l", "[x]", "true"});
  ASSERT_EQ(a.exit_code, std::nullopt);
  EXPECT_EQ(a.config.log_line_prefix_template, "[x]");
}

TEST(CliTest, ADoubleDashAfterTheScriptIsDroppedOnce) {
  auto a = Parse({"true", "--", "--depth=26", "--"});
  ASSERT_EQ(a.exit_code, std::nullopt);
  ASSERT_EQ(a.config.worker_argv.size(), 3u);
  EXPECT_EQ(a.config.worker_argv[1], "--depth=26");
  EXPECT_EQ(a.config.worker_argv[2], "--");
  auto b = Parse({"--nproc-per-node=2", "--", "true", "x"});
  ASSERT_EQ(b.exit_code, std::nullopt);
  EXPECT_EQ(b.config.worker_argv.size(), 2u);
}

TEST(CliTest, NewTorchrunFlagsParse) {
  auto a = Parse({"--virtual-local-rank", "--signals-to-handle",
                  "SIGTERM,SIGINT,SIGUSR1", "--numa-binding=exclusive",
                  "--duplicate-stdout-filters", "loss,,acc,step",
                  "--duplicate_stderr_filters=Error", "--event-log-handler",
                  "console", "--start-method=fork", "--shutdown-timeout", "5",
                  "true"});
  ASSERT_EQ(a.exit_code, std::nullopt);
  EXPECT_TRUE(a.config.virtual_local_rank);
  EXPECT_EQ(a.config.handled_signals.size(), 3u);
  EXPECT_EQ(a.config.numa_binding, "exclusive");
  EXPECT_EQ(a.config.duplicate_stdout_filters,
            (std::vector<std::string>{"loss,acc", "step"}));
  EXPECT_EQ(a.config.duplicate_stderr_filters,
            (std::vector<std::string>{"Error"}));
  EXPECT_EQ(a.config.term_timeout, std::chrono::milliseconds(5000));
}

TEST(CliTest, ChoicesAreCheckedAsTorchrunChecksThem) {
  EXPECT_EQ(Parse({"--start-method=thread", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--numa-binding=all", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--store-proxy=yes", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--store-proxy=off", "true"}).config.store_proxy,
            StoreProxyMode::kOff);
  EXPECT_EQ(Parse({"--restart=process", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--restart=in-place", "true"}).config.restart,
            RestartMode::kInPlace);
  EXPECT_EQ(Parse({"true"}).config.restart, RestartMode::kGroup);
  // etcd needs its members named.
  EXPECT_EQ(Parse({"--rdzv-backend=etcd", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--rdzv-backend=etcd-v2", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--rdzv-backend=c10", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--logs-specs=mine", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--event-log-handler=scuba", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--signals-to-handle=SIGKILL", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--signals-to-handle=SIGFOO", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--print-completion", "fish"}).exit_code, 2);
  EXPECT_EQ(Parse({"--nnodes=2", "--rdzv-backend=c10d",
                   "--rdzv-endpoint=localhost:0", "true"})
                .exit_code,
            2);
}

TEST(CliTest, SignalsToHandleFallsBackToTorchrunsVariable) {
  setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGUSR2", 1);
  auto a = Parse({"true"});
  auto b = Parse({"--signals-to-handle=SIGUSR1", "true"});
  unsetenv("TORCHELASTIC_SIGNALS_TO_HANDLE");
  ASSERT_EQ(a.exit_code, std::nullopt);
  EXPECT_EQ(a.config.handled_signals, std::vector<int>{SIGUSR2});
  EXPECT_EQ(b.config.handled_signals, std::vector<int>{SIGUSR1});
  EXPECT_EQ(Parse({"true"}).config.handled_signals.size(), 4u);
}

TEST(CliTest, FreePortEndpointHostsTheStoreOnOneNode) {
  auto a = Parse({"--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
                  "--rdzv-id=abc", "true"});
  ASSERT_EQ(a.exit_code, std::nullopt);
  EXPECT_TRUE(a.config.free_port_store);
  EXPECT_FALSE(a.config.uses_rendezvous());
  EXPECT_EQ(a.config.master_addr, "localhost");
  EXPECT_EQ(a.config.rdzv_id, "abc");
}

TEST(CliTest, NativeProgramsRunDirectlyOtherFilesThroughPython) {
  auto native = Parse({"--python", "sh", "true"});
  ASSERT_EQ(native.exit_code, std::nullopt);
  EXPECT_EQ(native.config.worker_argv[0], "/usr/bin/true");
  // A script without .py (here a shell script on $PATH) goes to Python,
  // as torchrun sends it.
  auto script = Parse({"--python", "sh", "ldd"});
  ASSERT_EQ(script.exit_code, std::nullopt);
  EXPECT_TRUE(script.config.python_worker);
  EXPECT_EQ(script.config.worker_argv[2], "/usr/bin/ldd");
  auto direct = Parse({"--no-python", "ldd"});
  ASSERT_EQ(direct.exit_code, std::nullopt);
  EXPECT_EQ(direct.config.worker_argv[0], "/usr/bin/ldd");
}

TEST(CliTest, CompletionsCoverTcsh) {
  testing::internal::CaptureStdout();
  EXPECT_EQ(Parse({"--print-completion", "tcsh"}).exit_code, 0);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("complete dtrun"), std::string::npos);
  EXPECT_NE(out.find("virtual-local-rank"), std::string::npos);
  EXPECT_NE(
      out.find("'n/--numa-binding/(node socket exclusive core-complex)/'"),
      std::string::npos);
}

// Every flag of torchrun's newest run.py (2026), both spellings, is a flag
// here and in the completions.
TEST(CliTest, EveryFlagOfNewestTorchrunIsKnown) {
  const char* flags[] = {"nnodes",
                         "nproc-per-node",
                         "rdzv-backend",
                         "rdzv-endpoint",
                         "rdzv-id",
                         "rdzv-conf",
                         "standalone",
                         "max-restarts",
                         "monitor-interval",
                         "start-method",
                         "event-log-handler",
                         "role",
                         "module",
                         "no-python",
                         "run-path",
                         "log-dir",
                         "redirects",
                         "tee",
                         "log-line-prefix-template",
                         "local-ranks-filter",
                         "duplicate-stdout-filters",
                         "duplicate-stderr-filters",
                         "node-rank",
                         "master-addr",
                         "master-port",
                         "local-addr",
                         "logs-specs",
                         "numa-binding",
                         "signals-to-handle",
                         "shutdown-timeout",
                         "virtual-local-rank",
                         "print-completion"};
  testing::internal::CaptureStdout();
  ASSERT_EQ(Parse({"--print-completion", "bash"}).exit_code, 0);
  std::string bash = testing::internal::GetCapturedStdout();
  testing::internal::CaptureStdout();
  ASSERT_EQ(Parse({"--help"}).exit_code, 0);
  std::string help = testing::internal::GetCapturedStdout();
  for (const char* f : flags) {
    std::string dashed = std::string("--") + f, under = dashed;
    for (size_t i = 2; i < under.size(); ++i)
      if (under[i] == '-') under[i] = '_';
    EXPECT_NE(help.find(dashed), std::string::npos) << dashed;
    EXPECT_NE(bash.find(dashed), std::string::npos) << dashed;
    // The underscore spelling is a flag too (its value may still be wrong).
    testing::internal::CaptureStderr();
    Parse({under + "=x", "true"});
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find("unknown flag"), std::string::npos)
        << under << ": " << err;
  }
}

TEST(CliTest, VirtualLocalRankNeedsAGpuForEachWorker) {
  setenv("CUDA_VISIBLE_DEVICES", "3", 1);
  auto short_list =
      Parse({"--nproc-per-node=2", "--virtual-local-rank", "true"});
  setenv("CUDA_VISIBLE_DEVICES", "3,4", 1);
  auto enough = Parse({"--nproc-per-node=2", "--virtual-local-rank", "true"});
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(short_list.exit_code, 2);
  EXPECT_EQ(enough.exit_code, std::nullopt);
}

TEST(SignalListTest, NamesAndNumbers) {
  EXPECT_EQ(*ParseSignalList("SIGTERM, USR1,12"),
            (std::vector<int>{SIGTERM, SIGUSR1, SIGUSR2}));
  EXPECT_FALSE(ParseSignalList("SIGSTOP").ok());
}

TEST(CommaListTest, DoubleCommaIsAComma) {
  EXPECT_EQ(ParseCommaList(""), std::vector<std::string>{});
  EXPECT_EQ(ParseCommaList("a,,b"), std::vector<std::string>{"a,b"});
  EXPECT_EQ(ParseCommaList("a,b"), (std::vector<std::string>{"a", "b"}));
}

TEST(CliTest, EtcdEndpointsAndSettings) {
  auto a = Parse({"--nnodes=2", "--rdzv-backend=etcd",
                  "--rdzv-endpoint=10.0.0.1,10.0.0.2:2380,[::1]:2381",
                  "--rdzv-conf=timeout=90", "true"});
  ASSERT_EQ(a.exit_code, std::nullopt);
  EXPECT_EQ(a.config.rdzv_backend, RdzvBackend::kEtcd);
  EXPECT_EQ(
      a.config.etcd_endpoints,
      (std::vector<std::string>{"10.0.0.1:2379", "10.0.0.2:2380", "::1:2381"}));
  // torchrun's etcd backend reads `timeout` as the join timeout.
  EXPECT_EQ(a.config.rdzv_conf.join_timeout, std::chrono::milliseconds(90000));
  EXPECT_TRUE(a.config.rdzv_conf.ignored.empty());
  EXPECT_EQ(a.config.rdzv_conf.protocol, "http");

  auto tls = Parse({"--nnodes=2", "--rdzv-backend=etcd-v2",
                    "--rdzv-endpoint=https://h1:2379,https://h2:2379", "true"});
  ASSERT_EQ(tls.exit_code, std::nullopt);
  EXPECT_EQ(tls.config.rdzv_conf.protocol, "https");

  // An explicit join_timeout wins over `timeout`; c10d ignores `timeout`.
  auto both = Parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=h1",
                     "--rdzv-conf=timeout=90,join_timeout=5", "true"});
  EXPECT_EQ(both.config.rdzv_conf.join_timeout,
            std::chrono::milliseconds(5000));
  auto c10d = Parse({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h1",
                     "--rdzv-conf=timeout=90", "true"});
  EXPECT_EQ(c10d.config.rdzv_conf.join_timeout,
            std::chrono::milliseconds(600000));
  EXPECT_EQ(c10d.config.rdzv_conf.ignored,
            (std::vector<std::string>{"timeout=90"}));

  for (auto bad : std::vector<std::vector<std::string>>{
           {"--rdzv-endpoint=http://h1,https://h2"},
           {"--rdzv-endpoint=https://h1", "--rdzv-conf=protocol=http"},
           {"--rdzv-endpoint=h1:99999"},
           {"--rdzv-endpoint=h1,,h2"},
           {"--rdzv-endpoint=h1", "--rdzv-conf=protocol=tls"},
           {"--rdzv-endpoint=h1", "--rdzv-conf=cert=/nonexistent"},
           {"--rdzv-endpoint=h1", "--rdzv-conf=is_host=1"},
           {"--rdzv-endpoint=h1", "--interactive"},
       }) {
    std::vector<std::string> args = {"--nnodes=2", "--rdzv-backend=etcd"};
    args.insert(args.end(), bad.begin(), bad.end());
    if (bad.back() != "--interactive") args.push_back("true");
    auto r = Parse(args);
    EXPECT_EQ(r.exit_code, 2) << bad.back();
  }
}

}  // namespace
}  // namespace dtrun::agent

namespace dtrun::agent {
namespace {

// --store-proxy=auto proxies only the jobs whose burst of connections
// would outgrow a default listen queue; on and off are what they say.
TEST(StoreProxyModeTest, AutoProxiesOnlyJobsOfMoreThan2048Workers) {
  EXPECT_FALSE(UsesStoreProxy(StoreProxyMode::kAuto, 8));
  EXPECT_FALSE(UsesStoreProxy(StoreProxyMode::kAuto, kProxyAutoWorkers));
  EXPECT_TRUE(UsesStoreProxy(StoreProxyMode::kAuto, kProxyAutoWorkers + 1));
  EXPECT_TRUE(UsesStoreProxy(StoreProxyMode::kOn, 2));
  EXPECT_FALSE(UsesStoreProxy(StoreProxyMode::kOff, 100000));
  EXPECT_EQ(Parse({"true"}).config.store_proxy, StoreProxyMode::kAuto);
}

// A store that cannot be reached leaves the workers on the store itself.
TEST(StoreProxyModeTest, AProxyThatCannotStartIsNull) {
  EXPECT_EQ(StartWorkerProxy("127.0.0.1", 1), nullptr);
}

}  // namespace
}  // namespace dtrun::agent
