#include "apps/dtrun/interactive.h"

#include <fcntl.h>
#include <ftw.h>
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

#include "apps/dtrun/clock.h"
#include "apps/dtrun/launcher.h"
#include "apps/dtrun/posix_spawner.h"
#include "dtrun_python_files.h"

namespace dtrun::agent {
namespace {

bool WriteFile(const std::string& path, const char* text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

// The Python package under <dir>/py; "" on success, else why not.
std::string WritePackage(const std::string& dir) {
  for (const auto& f : kPythonFiles) {
    std::string path = dir + "/py/" + f.path;
    for (size_t at = dir.size() + 1; (at = path.find('/', at + 1)) != std::string::npos;) {
      if (mkdir(path.substr(0, at).c_str(), 0755) != 0 && errno != EEXIST) {
        return "cannot create " + path.substr(0, at) + ": " + std::strerror(errno);
      }
    }
    if (!WriteFile(path, f.text)) return "cannot write " + path + ": " + std::strerror(errno);
  }
  return "";
}

void PrependPythonPath(const std::string& dir) {
  const char* old = std::getenv("PYTHONPATH");
  std::string value = dir + (old && *old ? std::string(":") + old : "");
  setenv("PYTHONPATH", value.c_str(), 1);
}

int RunLauncher(const LaunchConfig& config, Launcher::StoreReady ready) {
  PosixSpawner spawner;
  SteadyClock clock;
  Launcher launcher(config, &spawner, &clock);
  launcher.on_store_ready = std::move(ready);
  return launcher.Run();
}

// GPUs the workers can address: CUDA_VISIBLE_DEVICES' entries when set (the
// ids are indices into it, as CUDA numbers them), else the host's devices.
int VisibleGpus() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible) return CountGpus();
  int listed = 0;
  for (std::string rest = visible; !rest.empty();) {
    size_t comma = rest.find(',');
    std::string item = rest.substr(0, comma);
    if (item == "-1") break;  // CUDA stops at an invalid entry
    if (!item.empty()) ++listed;
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  return listed;
}

}  // namespace

std::string CheckGpuIds(const std::string& ids, int nproc, int visible) {
  std::vector<int> seen;
  size_t start = 0;
  while (start <= ids.size()) {
    size_t comma = ids.find(',', start);
    std::string item = ids.substr(start, comma == std::string::npos ? comma : comma - start);
    char* end = nullptr;
    long id = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || id < 0) {
      return "--gpu-ids: '" + item + "' is not a GPU id; give ids like 0,2";
    }
    if (id >= visible) {
      return "--gpu-ids: unknown GPU " + item + ": this host shows " + std::to_string(visible) +
             " GPU(s)" + (visible ? " (ids 0-" + std::to_string(visible - 1) + ")" : "") +
             (std::getenv("CUDA_VISIBLE_DEVICES") ? " through CUDA_VISIBLE_DEVICES" : "");
    }
    for (int s : seen) {
      if (s == id) return "--gpu-ids: GPU " + item + " is listed twice; give each rank its own";
    }
    seen.push_back(static_cast<int>(id));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(seen.size()) < nproc) {
    return "--gpu-ids: " + std::to_string(seen.size()) + " id(s) for " + std::to_string(nproc) +
           " ranks; give one GPU per rank";
  }
  return "";
}

namespace {

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::string line, tail;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  for (size_t i = lines.size() > 15 ? lines.size() - 15 : 0; i < lines.size(); ++i) {
    tail += "  " + lines[i] + "\n";
  }
  return tail;
}

}  // namespace

int RunInteractive(const LaunchConfig& config) {
  if (!config.gpu_ids.empty()) {
    std::string err = CheckGpuIds(config.gpu_ids, config.nproc_per_node, VisibleGpus());
    if (!err.empty()) {
      std::fprintf(stderr, "dtrun: %s\n", err.c_str());
      return 2;
    }
    setenv("DTRUN_GPU_IDS", config.gpu_ids.c_str(), 1);  // read by dtrun.worker
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/dtrun-interactive-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) {
    std::fprintf(stderr, "dtrun: cannot create a session folder '%s': %s; set TMPDIR\n",
                 templ.c_str(), std::strerror(errno));
    return 1;
  }
  const std::string dir = buf.data();
  if (std::string err = WritePackage(dir); !err.empty()) {
    std::fprintf(stderr, "dtrun: %s\n", err.c_str());
    return 1;
  }
  PrependPythonPath(dir + "/py");
  // The console talks to the store too: it and the workers share one shim.
  if (Status s = InstallTorchShimInProcess(dir + "/shim"); !s.ok()) {
    std::fprintf(stderr, "dtrun: %s\n", s.message().c_str());
    return 1;
  }
  LaunchConfig launch = config;
  if (launch.log_dir.empty()) launch.log_dir = dir + "/logs";
  // With several nodes the address handed on is the rendezvous store's; the
  // workers' store of the current round is named under `rdzv_key` there.
  const bool nodes = launch.uses_rendezvous();
  const int world = launch.nproc_per_node * (nodes ? launch.max_nodes : 1);
  const std::string rdzv_key = nodes ? "dtrun/i/" + launch.rdzv_id + "/current" : "";
  if (nodes && !launch.local_addr.empty()) setenv("DTRUN_NODE_ADDR", launch.local_addr.c_str(), 1);

  if (config.no_console) {
    int rc = RunLauncher(launch, [&](const std::string& host, uint16_t port, const std::string&) {
      std::printf("dtrun-interactive: host %s port %u world %d dir %s%s%s\n", host.c_str(), port,
                  world, dir.c_str(), nodes ? " key " : "", rdzv_key.c_str());
      std::fflush(stdout);
    });
    if (rc == 0) {  // a clean shutdown; otherwise the logs stay for a look
      nftw(dir.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); },
           16, FTW_DEPTH | FTW_PHYS);
    }
    return rc;
  }

  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "dtrun: pipe: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string log = dir + "/dtrun.log";
  const pid_t console_pid = getpid();
  const pid_t child = fork();
  if (child < 0) {
    std::fprintf(stderr, "dtrun: fork: %s\n", std::strerror(errno));
    return 1;
  }
  if (child == 0) {
    // The launcher: away from the terminal's signals, gone with the console.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != console_pid) _exit(1);
    close(ready[0]);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (null >= 0) dup2(null, 0);
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    int fd = ready[1];
    _exit(RunLauncher(launch, [fd](const std::string& host, uint16_t port, const std::string&) {
      std::string line = host + " " + std::to_string(port) + "\n";
      (void)!write(fd, line.data(), line.size());
      close(fd);
    }));
  }
  close(ready[1]);
  std::string line;
  char c;
  pollfd p{ready[0], POLLIN, 0};
  while (poll(&p, 1, 60000) > 0 && read(ready[0], &c, 1) == 1 && c != '\n') line += c;
  close(ready[0]);
  size_t space = line.find(' ');
  if (space == std::string::npos) {
    int status = 0;
    kill(child, SIGTERM);
    waitpid(child, &status, 0);
    std::fprintf(stderr, "dtrun: the interactive session did not start; %s says:\n%s", log.c_str(),
                 Tail(log).c_str());
    return 1;
  }
  std::string python = launch.worker_argv.empty() ? launch.python : launch.worker_argv[0];
  std::vector<std::string> args = {python,
                                   "-m",
                                   "dtrun.console",
                                   "--host",
                                   line.substr(0, space),
                                   "--port",
                                   line.substr(space + 1),
                                   "--world-size",
                                   std::to_string(world),
                                   "--launcher-pid",
                                   std::to_string(child),
                                   "--log",
                                   log,
                                   "--session-dir",
                                   dir};
  if (nodes) {
    args.push_back("--rdzv-key");
    args.push_back(rdzv_key);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(python.c_str(), argv.data());
  std::fprintf(stderr, "dtrun: cannot run the console with %s: %s\n", python.c_str(),
               std::strerror(errno));
  kill(child, SIGTERM);
  return 1;
}

}  // namespace dtrun::agent
