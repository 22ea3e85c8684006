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
  LaunchConfig launch = config;
  if (launch.log_dir.empty()) launch.log_dir = dir + "/logs";
  const int world = launch.nproc_per_node;

  if (config.no_console) {
    int rc = RunLauncher(launch, [&](const std::string& host, uint16_t port, const std::string&) {
      std::printf("dtrun-interactive: host %s port %u world %d dir %s\n", host.c_str(), port,
                  world, dir.c_str());
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
