// `dtrun --interactive`: the session folder with the embedded Python package,
// the launcher in a child of its own process group (so Ctrl-C in the terminal
// reaches only the console, which forwards it to the ranks as a cell
// interrupt), and the console exec'd in dtrun's place so it owns the terminal.
#include "apps/dtrun/interactive.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "apps/dtrun/devices.h"
#include "apps/dtrun/exit_code.h"
#include "apps/dtrun/interactive_protocol.h"
#include "apps/dtrun/worker_env.h"
#include "rendezvous/util/os_util.h"
#include "dtrun_python_files.h"

namespace dtrun::agent {
namespace {

// The Python package under <dir>/py; "" on success, else why not.
std::string WritePackage(const std::string& dir) {
  for (const auto& f : kPythonFiles) {
    std::string path = dir + "/py/" + f.path;
    Status s = os::MakeDirs(path.substr(0, path.rfind('/')));
    if (s.ok()) s = os::WriteFile(path, f.text);
    if (!s.ok()) return s.message();
  }
  return "";
}

// `dir` first on env's PYTHONPATH.
void PrependPythonPath(const std::string& dir, EnvMap* env) {
  const std::string& old = (*env)["PYTHONPATH"];
  (*env)["PYTHONPATH"] = dir + (old.empty() ? "" : ":" + old);
}

// GPUs the workers can address: CUDA_VISIBLE_DEVICES' entries when set (the
// ids are indices into it, as CUDA numbers them), else the host's devices.
int VisibleGpus(const EnvMap& env) {
  auto visible = env.find("CUDA_VISIBLE_DEVICES");
  if (visible == env.end()) return CountGpus(env);
  int listed = 0;
  for (std::string rest = visible->second; !rest.empty();) {
    size_t comma = rest.find(',');
    std::string item = rest.substr(0, comma);
    if (item == "-1") break;  // CUDA stops at an invalid entry
    if (!item.empty()) ++listed;
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  return listed;
}

}  // namespace

std::string CheckGpuIds(const std::string& ids, int nproc, int visible,
                        bool through_cuda_visible_devices) {
  std::vector<int> seen;
  size_t start = 0;
  while (start <= ids.size()) {
    size_t comma = ids.find(',', start);
    std::string item =
        ids.substr(start, comma == std::string::npos ? comma : comma - start);
    char* end = nullptr;
    long id = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || id < 0) {
      return "--gpu-ids: '" + item + "' is not a GPU id; give ids like 0,2";
    }
    if (id >= visible) {
      return "--gpu-ids: unknown GPU " + item + ": this host shows " +
             std::to_string(visible) + " GPU(s)" +
             (visible ? " (ids 0-" + std::to_string(visible - 1) + ")" : "") +
             (through_cuda_visible_devices ? " through CUDA_VISIBLE_DEVICES"
                                           : "");
    }
    for (int s : seen) {
      if (s == id)
        return "--gpu-ids: GPU " + item +
               " is listed twice; give each rank its own";
    }
    seen.push_back(static_cast<int>(id));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(seen.size()) < nproc) {
    return "--gpu-ids: " + std::to_string(seen.size()) + " id(s) for " +
           std::to_string(nproc) + " ranks; give one GPU per rank";
  }
  return "";
}

namespace {

// What every session needs before its launcher starts: the folder, the
// Python package in it, the console's torch shim, the launch config. Nothing
// goes through this process's own environment: launch.environment, with the
// package, the shim and the variables dtrun.worker reads, is the workers'
// (through the launcher) and the console's (through execve).
struct Session {
  std::string dir;
  LaunchConfig launch;
  // several nodes: the console attaches to the rendezvous store
  bool nodes = false;
  int world = 0;
  // several nodes: names the current round's workers' store
  std::string rdzv_key;
};

Result<Session> PrepareSession(const LaunchConfig& config) {
  Session s;
  s.launch = config;
  EnvMap& env = s.launch.environment;
  if (!config.gpu_ids.empty()) {
    std::string err =
        CheckGpuIds(config.gpu_ids, config.nproc_per_node, VisibleGpus(env),
                    env.count("CUDA_VISIBLE_DEVICES") > 0);
    if (!err.empty()) return Status::Invalid(err);
    env["DTRUN_GPU_IDS"] = config.gpu_ids;  // read by dtrun.worker
  }
  auto dir = os::MakeTempDir("dtrun-interactive-");
  if (!dir.ok()) return dir.status();
  s.dir = *dir;
  if (std::string err = WritePackage(s.dir); !err.empty())
    return Status::Io(err);
  PrependPythonPath(s.dir + "/py", &env);
  // The console talks to the store too: it and the workers share one shim
  // (the workers see it in place and add no second copy).
  if (Status st = InstallTorchShim(s.dir + "/shim", &env); !st.ok()) return st;
  if (s.launch.log_dir.empty()) s.launch.log_dir = s.dir + "/logs";
  // With several nodes the address handed on is the rendezvous store's; the
  // workers' store of the current round is named under `rdzv_key` there.
  s.nodes = s.launch.uses_rendezvous();
  s.world = s.launch.nproc_per_node * (s.nodes ? s.launch.max_nodes : 1);
  if (s.nodes)
    s.rdzv_key = interactive_protocol::CurrentRoundKey(s.launch.rdzv_id);
  if (s.nodes && !s.launch.local_addr.empty())
    env["DTRUN_NODE_ADDR"] = s.launch.local_addr;  // read by dtrun.worker
  return s;
}

// --no-console: the launcher runs here and prints where the session is.
int RunHeadless(const Session& s, const RunJobFn& run_job) {
  int rc = run_job(s.launch, [&](const std::string& host, uint16_t port,
                                 const std::string&) {
    std::printf("%s\n", interactive_protocol::SessionLine(host, port, s.world,
                                                          s.dir, s.rdzv_key)
                            .c_str());
    std::fflush(stdout);
  });
  if (rc == kExitSuccess)
    os::RemoveTree(s.dir);  // otherwise the logs stay for a look
  return rc;
}

// The launcher's child: away from the terminal's signals (its own process
// group, so Ctrl-C reaches only the console) and gone with the console.
// Writes "host port\n" to `ready_fd` once the store listens.
[[noreturn]] void RunLauncherChild(const Session& s, const RunJobFn& run_job,
                                   pid_t console_pid, int ready_fd,
                                   const std::string& log) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != console_pid) _exit(1);  // the console died before prctl
  int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (null >= 0) dup2(null, 0);
  if (out >= 0) {
    dup2(out, 1);
    dup2(out, 2);
  }
  _exit(run_job(s.launch, [ready_fd](const std::string& host, uint16_t port,
                                     const std::string&) {
    std::string line = host + " " + std::to_string(port) + "\n";
    (void)!write(ready_fd, line.data(), line.size());
    close(ready_fd);
  }));
}

// Forks the launcher; returns its pid and the store's "host port", or why
// not (and sets `exit_code`).
Result<std::pair<pid_t, std::string>> ForkLauncher(const Session& s,
                                                   const RunJobFn& run_job,
                                                   const std::string& log,
                                                   int* exit_code) {
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0)
    return Status::Io(std::string("pipe: ") + std::strerror(errno));
  const pid_t console_pid = getpid();
  const pid_t child = fork();
  if (child < 0)
    return Status::Io(std::string("fork: ") + std::strerror(errno));
  if (child == 0) {
    close(ready[0]);
    RunLauncherChild(s, run_job, console_pid, ready[1], log);
  }
  close(ready[1]);
  std::string line;
  char c;
  pollfd p{ready[0], POLLIN, 0};
  while (poll(&p, 1, 60000) > 0 && read(ready[0], &c, 1) == 1 && c != '\n')
    line += c;
  close(ready[0]);
  if (line.find(' ') == std::string::npos) {
    kill(child, SIGTERM);
    int status = 0;
    waitpid(child, &status, 0);
    // The launcher's own code says what failed (2: config, 3: store).
    *exit_code = WIFEXITED(status) && WEXITSTATUS(status) != 0
                     ? WEXITSTATUS(status)
                     : kExitSetup;
    return Status::Unavailable("the interactive session did not start; " + log +
                               " says:\n" + os::ReadTail(log, 15));
  }
  return std::make_pair(child, line);
}

// Becomes the Python console (returns only if exec failed).
int ExecConsole(const Session& s, pid_t launcher, const std::string& address,
                const std::string& log) {
  size_t space = address.find(' ');
  std::string python =
      s.launch.worker_argv.empty() ? s.launch.python : s.launch.worker_argv[0];
  std::vector<std::string> args = {python,
                                   "-m",
                                   "dtrun.console",
                                   "--host",
                                   address.substr(0, space),
                                   "--port",
                                   address.substr(space + 1),
                                   "--world-size",
                                   std::to_string(s.world),
                                   "--launcher-pid",
                                   std::to_string(launcher),
                                   "--log",
                                   log,
                                   "--session-dir",
                                   s.dir};
  if (s.nodes) {
    args.push_back("--rdzv-key");
    args.push_back(s.rdzv_key);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  for (const auto& [name, value] : s.launch.environment)
    env_text.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  execve(python.c_str(), argv.data(), envp.data());
  std::fprintf(stderr, "dtrun: cannot run the console with %s: %s\n",
               python.c_str(), std::strerror(errno));
  kill(launcher, SIGTERM);
  return kExitUsage;
}

}  // namespace

int RunInteractive(const LaunchConfig& config, const RunJobFn& run_job) {
  auto session = PrepareSession(config);
  if (!session.ok()) {
    std::fprintf(stderr, "dtrun: %s\n", session.status().message().c_str());
    return session.status().code() == Status::Code::kInvalid ? kExitUsage
                                                             : kExitSetup;
  }
  if (config.no_console) return RunHeadless(*session, run_job);
  const std::string log = session->dir + "/dtrun.log";
  int exit_code = kExitSetup;
  auto launcher = ForkLauncher(*session, run_job, log, &exit_code);
  if (!launcher.ok()) {
    std::fprintf(stderr, "dtrun: %s", launcher.status().message().c_str());
    return exit_code;
  }
  return ExecConsole(*session, launcher->first, launcher->second, log);
}

}  // namespace dtrun::agent
