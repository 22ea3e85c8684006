#include "apps/dtrun/posix_spawner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dtrun::agent {

Result<int> PosixSpawner::Spawn(const WorkerSpec& spec) {
  // Everything the child touches is prepared before fork: after it only
  // async-signal-safe calls are allowed (no allocation, no logging).
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // exec failures travel back through a close-on-exec pipe: EOF = exec'd.
  int status_pipe[2];
  if (pipe2(status_pipe, O_CLOEXEC) != 0) {
    return Status::Io(std::string("pipe: ") + std::strerror(errno));
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(status_pipe[0]);
    close(status_pipe[1]);
    return Status::Io(std::string("fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the agent died before prctl
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    if (spec.stdout_fd >= 0) dup2(spec.stdout_fd, 1);
    if (spec.stderr_fd >= 0) dup2(spec.stderr_fd, 2);
    execve(argv[0], argv.data(), envp.data());
    int err = errno;
    (void)!write(status_pipe[1], &err, sizeof(err));
    _exit(127);
  }
  setpgid(pid, pid);  // also in the parent, so Signal never races the child
  close(status_pipe[1]);
  int err = 0;
  ssize_t n;
  do {
    n = read(status_pipe[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  close(status_pipe[0]);
  local_rank_of_[pid] = spec.local_rank;
  if (n == sizeof(err)) {
    return Status::Io("cannot execute '" + spec.argv[0] + "': " + std::strerror(err));
  }
  return pid;
}

void PosixSpawner::Signal(int pid, int signo) {
  if (local_rank_of_.count(pid) == 0) return;  // already reaped: pid may be reused
  if (kill(-pid, signo) != 0) kill(pid, signo);
}

std::vector<WorkerExit> PosixSpawner::Reap() {
  std::vector<WorkerExit> out;
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    auto it = local_rank_of_.find(pid);
    if (it == local_rank_of_.end()) continue;
    WorkerExit e;
    e.local_rank = it->second;
    e.pid = pid;
    if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
    local_rank_of_.erase(it);
    out.push_back(e);
  }
  return out;
}

}  // namespace dtrun::agent
