// The one place dtrun starts its workers. The order of things around the
// child's start is what matters here: everything is allocated before it (only
// system calls after), the child makes its own process group and arms
// PDEATHSIG before exec, and exec failures come back through a close-on-exec
// pipe so a missing program is a message, not a silent exit 127.
//
// The child is a vfork-style clone (CLONE_VM | CLONE_VFORK) on a stack of its
// own, not a fork: it borrows dtrun's memory until exec instead of copying
// its page tables, and dtrun pays neither the copy nor the copy-on-write
// faults after it. At 512 agents on one 2-core machine that took the
// rendezvous benchmark from 6.0 s to 4.3 s. dtrun installs no signal
// handlers (its signals arrive through a signalfd), so nothing of dtrun's can
// run on the child's stack; every signal stays blocked until just before
// exec all the same.
#include "apps/dtrun/posix_worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <linux/close_range.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "apps/dtrun/error_report.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/memory_checkpoint.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

StreamRoute ToStreamRoute(const OutputRoute& route, int pid) {
  StreamRoute out;
  out.console_fd = route.console_fd;
  out.prefix = route.prefix;
  const std::string key = "${pid}", value = std::to_string(pid);
  for (size_t at = out.prefix.find(key); at != std::string::npos;
       at = out.prefix.find(key, at + value.size())) {
    out.prefix.replace(at, key.size(), value);
  }
  if (!route.file.empty()) {
    out.file_path = route.file;
    out.file_fd = open(route.file.c_str(),
                       O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out.file_fd < 0) out.file_error = std::strerror(errno);
  }
  if (!route.filtered_file.empty()) {
    out.filters = route.filters;
    out.filtered_fd = open(route.filtered_file.c_str(),
                           O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
  return out;
}

// Every descriptor above stderr closes at exec, as torchrun's workers get
// them (Popen's close_fds): dtrun's own sockets (the stores it hosts, their
// clients, a proxy's connection) would otherwise live on in every worker,
// and in anything a worker leaves behind, after dtrun is gone. Marked, not
// closed, so the exec-status pipe still reports a failed exec. A system
// call only (it runs in the child before exec); a kernel older than 5.11
// has none, and then they are inherited as before.
void KeepOnlyStandardStreams() { close_range(3, ~0U, CLOSE_RANGE_CLOEXEC); }

// Polls `fds` for up to `timeout_ms`; calls `readable` for each ready one.
// Returns false when nothing was ready.
template <typename F>
bool PollOutput(const std::vector<int>& fds, int timeout_ms, F readable) {
  std::vector<pollfd> polled;
  for (int fd : fds) polled.push_back({fd, POLLIN, 0});
  if (polled.empty() || poll(polled.data(), polled.size(), timeout_ms) <= 0)
    return false;
  for (const auto& p : polled) {
    if (p.revents) readable(p.fd);
  }
  return true;
}

// Starts a tool with stdout and stderr to `path`; returns its pid or -1.
int SpawnTool(const ToolRun& tool) {
  int fd = open(tool.output_file.c_str(),
                O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  std::vector<char*> args;
  for (const std::string& a : tool.argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    // dtrun blocks its stop signals for the signalfd; the tool must not
    // inherit that mask, or a kill at the deadline could not stop it.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(fd, 1);
    dup2(fd, 2);
    KeepOnlyStandardStreams();
    execv(args[0], args.data());
    _exit(127);
  }
  close(fd);
  return pid;
}

}  // namespace

Result<int> PosixWorkerGroup::Spawn(const WorkerSpec& spec) {
  KillLingering();
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    return Status::Io(std::string("pipe: ") + std::strerror(errno));
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return Status::Io(std::string("pipe: ") + std::strerror(errno));
  }
  // Only dtrun's ends read without blocking. O_NONBLOCK belongs to each
  // end's open file, so the worker's stdout and stderr stay blocking: a
  // worker that writes faster than its lines are shown waits, as under
  // torchrun, instead of getting EAGAIN (Python then drops what it had
  // buffered, or dies of BlockingIOError).
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
  auto warm = FromStandby(spec, out[1], err[1]);
  Result<int> pid = warm ? std::move(*warm) : ForkExec(spec, out[1], err[1]);
  close(out[1]);
  close(err[1]);
  // The pipes are read even when exec failed: the mux closes them at EOF.
  int shown_pid = pid.ok() ? *pid : 0;
  if (pid.ok()) witness_.Watch(*pid);
  mux_.Add(out[0], ToStreamRoute(spec.out, shown_pid));
  mux_.Add(err[0], ToStreamRoute(spec.err, shown_pid));
  return pid;
}

namespace {

// What the child needs, all made before it starts: it may only make system
// calls (it runs in dtrun's memory, on its own stack).
struct ChildPlan {
  char** argv;
  char** envp;
  int out_fd, err_fd, status_fd;
  pid_t parent;
  bool bind;  // --numa-binding: apply `cpus` before exec
  cpu_set_t cpus;
};

constexpr size_t kChildStack = 64 * 1024;

int ChildMain(void* arg) {
  const ChildPlan& plan = *static_cast<const ChildPlan*>(arg);
  setpgid(0, 0);
  // PDEATHSIG is armed in the child: if dtrun died before, the parent is
  // already someone else, and the worker must not run unwatched.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != plan.parent) _exit(127);
  signal(SIGPIPE, SIG_DFL);  // the child's own dispositions (no CLONE_SIGHAND)
  dup2(plan.out_fd, 1);
  dup2(plan.err_fd, 2);
  KeepOnlyStandardStreams();
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (plan.bind && sched_setaffinity(0, sizeof(plan.cpus), &plan.cpus) != 0) {
    int error = errno;
    (void)!write(plan.status_fd, &error, sizeof(error));
    _exit(127);
  }
  execve(plan.argv[0], plan.argv, plan.envp);
  int error = errno;
  (void)!write(plan.status_fd, &error, sizeof(error));
  _exit(127);
}

// Starts the child that runs `plan`, every signal blocked meanwhile (the
// child unblocks its own); -1 and *error on failure. CLONE_VFORK: this
// thread resumes once the child has exec'd or exited, so the stack and the
// plan outlive the child's use of them.
pid_t CloneChild(ChildPlan* plan, int* error) {
  std::unique_ptr<char[]> stack(new char[kChildStack]);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = clone(ChildMain, stack.get() + kChildStack,
                    CLONE_VM | CLONE_VFORK | SIGCHLD, plan);
  *error = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return pid;
}

}  // namespace

Result<int> PosixWorkerGroup::ForkExec(const WorkerSpec& spec, int out_fd,
                                       int err_fd) {
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
  ChildPlan plan;
  plan.argv = argv.data();
  plan.envp = envp.data();
  plan.out_fd = out_fd;
  plan.err_fd = err_fd;
  plan.status_fd = status_pipe[1];
  plan.parent = getpid();
  plan.bind = !spec.cpus.empty();
  CPU_ZERO(&plan.cpus);
  for (int cpu : spec.cpus) CPU_SET(cpu, &plan.cpus);
  int clone_error = 0;
  pid_t pid = CloneChild(&plan, &clone_error);
  close(status_pipe[1]);
  if (pid < 0) {
    close(status_pipe[0]);
    return Status::Io(std::string("clone: ") + std::strerror(clone_error));
  }
  setpgid(pid, pid);  // also in the parent, so Signal never races the child
  int error = 0;
  ssize_t n;
  do {
    n = read(status_pipe[0], &error, sizeof(error));
  } while (n < 0 && errno == EINTR);
  close(status_pipe[0]);
  // Even a failed exec leaves a child to reap (it exits 127).
  local_rank_of_[pid] = spec.local_rank;
  if (n == sizeof(error)) {
    return Status::Io("cannot execute '" + spec.argv[0] +
                      "': " + std::strerror(error));
  }
  return pid;
}

void PosixWorkerGroup::UseStandby(std::unique_ptr<Standby> standby) {
  standby_ = std::move(standby);
}

// The worker forked by the standby, or nullopt to start it cold: no
// standby, one still importing (the caller waited for it already:
// standby_wait), or one that cannot (then it is dropped, saying why, and
// every later worker starts cold too).
std::optional<Result<int>> PosixWorkerGroup::FromStandby(const WorkerSpec& spec,
                                                         int out_fd,
                                                         int err_fd) {
  warm_ = false;
  const bool restart = !spawned_ranks_.insert(spec.local_rank).second;
  if (!standby_) return std::nullopt;
  auto ready = standby_->Ready();
  if (ready.ok() && !*ready) {
    if (restart) standby_missed_ = true;
    Logger("dtrun.agent")
        ->info("local_rank {}: the standby is still {}; started cold",
               spec.local_rank, standby_->native() ? "starting" : "importing");
    return std::nullopt;
  }
  Result<int> pid = ready.ok() ? standby_->Fork(spec, out_fd, err_fd)
                               : Result<int>(ready.status());
  if (!pid.ok()) {
    DropStandby(pid.status().message());
    return std::nullopt;
  }
  local_rank_of_[*pid] = spec.local_rank;
  warm_ = true;
  return pid;
}

milliseconds PosixWorkerGroup::standby_wait() const {
  if (!standby_ || standby_->ready() || standby_missed_ ||
      spawned_ranks_.empty())
    return milliseconds(0);
  return standby_->restart_wait();
}

void PosixWorkerGroup::DropStandby(const std::string& why) {
  Logger("dtrun.agent")
      ->warn("{}: {}; workers start cold from now on", standby_->flag(), why);
  standby_.reset();
}

void PosixWorkerGroup::Signal(int pid, int signo) {
  if (local_rank_of_.count(pid) == 0)
    return;  // already reaped: pid may be reused
  // The group first (a worker's own children); the pid alone if the worker
  // has not yet made its group (only possible before setpgid in the child).
  if (kill(-pid, signo) != 0) kill(pid, signo);
}

void PosixWorkerGroup::Stop(int pid, int signo) {
  if (signo == SIGKILL || local_rank_of_.count(pid) == 0)
    return Signal(pid, signo);
  // The worker alone first: its handler may still need its own children (a
  // DataLoader's workers, a data server) for an emergency save, which
  // torch 2.x's killpg takes from it. The rest of its group gets the signal
  // when it exits (Reap), and SIGKILL at the grace's end reaches them all.
  kill(pid, signo);
  group_signal_[pid] = signo;
}

std::vector<int> PosixWorkerGroup::output_fds() const {
  std::vector<int> fds = mux_.fds();
  if (standby_ && !standby_said_) fds.push_back(standby_->fd());
  return fds;
}

void PosixWorkerGroup::OnReadable(int fd) {
  if (standby_ && fd == standby_->fd()) {
    WatchStandby();
  } else {
    mux_.OnReadable(fd);
  }
}

// Said once, as soon as it is known: the standby is ready, or it refused.
void PosixWorkerGroup::WatchStandby() {
  if (!standby_ || standby_said_) return;
  auto ready = standby_->Ready();
  if (!ready.ok()) {
    DropStandby(ready.status().message());
  } else if (*ready) {
    standby_said_ = true;
    Logger("dtrun.agent")
        ->info(
            "{}: the standby is ready (its {} took {:.2f} s); restarted "
            "workers are forked from it",
            standby_->flag(), standby_->native() ? "start" : "imports",
            standby_->import_seconds());
  }
}

std::vector<WorkerExit> PosixWorkerGroup::Reap() {
  WatchStandby();
  std::vector<WorkerExit> out;
  for (;;) {
    int status = 0;
    rusage usage{};
    // wait4 for the child's peak RSS (the kernel's high-water mark), which
    // an OOM kill's account quotes.
    pid_t pid = wait4(-1, &status, WNOHANG, &usage);
    if (pid <= 0) break;
    if (standby_ && pid == standby_->pid()) {
      standby_->OnExited();
      // A standby that refused said why before it exited.
      auto said = standby_->Ready();
      DropStandby(
          !said.ok() && said.status().code() == Status::Code::kUnavailable
              ? said.status().message()
          : WIFSIGNALED(status)
              ? "the standby was killed by " + SignalName(WTERMSIG(status))
              : "the standby exited with code " +
                    std::to_string(WEXITSTATUS(status)));
      continue;
    }
    auto it = local_rank_of_.find(pid);
    if (it == local_rank_of_.end())
      continue;  // a tool's, or a worker's orphan we adopted
    WorkerExit e;
    e.local_rank = it->second;
    e.pid = pid;
    if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
    if (WIFSIGNALED(status)) e.core_dumped = WCOREDUMP(status);
    e.cause = witness_.WhyDied(e, static_cast<double>(usage.ru_maxrss) / 1024,
                               &e.oom);
    auto pending = group_signal_.find(pid);
    if (pending != group_signal_.end()) {
      kill(-pid, pending->second);  // the children it left, now it is done
      group_signal_.erase(pending);
      lingering_.insert(pid);
    }
    local_rank_of_.erase(it);
    // A collectives' segment it made but had not yet unnamed (it died while
    // its peers were opening it).
    memory_checkpoint::RemoveMemoryCopies(
        memory_checkpoint::CollectiveSegmentPrefix(pid));
    out.push_back(e);
  }
  return out;
}

std::vector<std::string> PosixWorkerGroup::LogErrors() const {
  return mux_.file_errors();
}

std::vector<std::string> PosixWorkerGroup::KernelErrors() {
  return witness_.GpuErrors();
}

void PosixWorkerGroup::ReadPending(milliseconds limit) {
  auto until = steady_clock::now() + limit;
  while (steady_clock::now() < until &&
         PollOutput(mux_.fds(), 10, [this](int fd) { mux_.OnReadable(fd); })) {
  }
}

void PosixWorkerGroup::Drain(milliseconds limit) {
  auto until = steady_clock::now() + limit;
  while (!mux_.fds().empty() && steady_clock::now() < until) {
    PollOutput(mux_.fds(), 50, [this](int fd) { mux_.OnReadable(fd); });
  }
  mux_.CloseAll();
  KillLingering();
}

// Children of stopped workers that outlived the signal their group got at
// the worker's exit: the attempt is over, nothing of it may run on.
void PosixWorkerGroup::KillLingering() {
  for (int group : lingering_) kill(-group, SIGKILL);
  lingering_.clear();
}

void PosixWorkerGroup::RunTools(const std::vector<ToolRun>& tools,
                                milliseconds limit) {
  std::vector<int> pids;
  for (const ToolRun& tool : tools) {
    int pid = SpawnTool(tool);
    if (pid > 0) pids.push_back(pid);
  }
  // waitpid on each tool's own pid, never -1: workers are reaped by Reap().
  auto until = steady_clock::now() + limit;
  while (!pids.empty()) {
    for (size_t i = 0; i < pids.size();) {
      if (waitpid(pids[i], nullptr, WNOHANG) != 0) {
        pids.erase(pids.begin() + i);
      } else {
        ++i;
      }
    }
    if (pids.empty() || steady_clock::now() < until) {
      usleep(10000);
      continue;
    }
    for (int pid : pids) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    return;
  }
}

}  // namespace dtrun::agent
