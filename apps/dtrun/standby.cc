// dtrun's end of the standby (standby.h). The standby is started with
// posix_spawn (its socket at descriptor 3, its own process group so a
// Ctrl-C at the terminal is dtrun's to pass on, every signal unblocked);
// each request is one SOCK_SEQPACKET packet of JSON carrying the worker's
// two output descriptors, each answer one packet. The standby exits when
// dtrun's end of the socket closes (dtrun gone, or the standby dropped).
#include "apps/dtrun/standby.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "apps/dtrun/run_layout.h"
#include "dtrun_standby_files.h"
#include "rendezvous/standby_protocol.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"

extern char** environ;

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;
namespace sp = standby_protocol;

// How long a fork may take before the standby counts as hung: two forks of
// a process of a few hundred MB take milliseconds.
constexpr milliseconds kForkLimit(10000);

// The standby's command: a native program's own, or Python's boot line.
std::vector<std::string> StandbyArgv(const StandbyPlan& plan) {
  if (!plan.argv.empty()) return plan.argv;
  // The standby imports this file as a module, not as __main__, so the
  // worker it becomes can make __main__ the user's script.
  const std::string boot =
      "import sys; sys.path.insert(0, sys.argv[1]); "
      "import dtrun_standby; dtrun_standby.main()";
  std::string modules;
  for (const auto& m : plan.modules)
    modules += (modules.empty() ? "" : ",") + m;
  return {plan.interpreter,
          "-u",
          "-c",
          boot,
          plan.dir,
          std::to_string(sp::kSocketFd),
          modules};
}

// The socket's end at kSocketFd, and the log as stdout and stderr.
Status SpawnStandby(const StandbyPlan& plan, int fd, pid_t* pid) {
  std::vector<std::string> args = StandbyArgv(plan);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = plan.env;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd, sp::kSocketFd);
  posix_spawn_file_actions_addopen(&actions, 1, plan.log_file.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  // Nothing else of dtrun's (its sockets) reaches the standby, or through
  // it the workers it forks.
  posix_spawn_file_actions_addclosefrom_np(&actions, sp::kSocketFd + 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF |
                                      POSIX_SPAWN_SETPGROUP);
  int error =
      posix_spawn(pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (error != 0) {
    return Status::Io("cannot start the standby '" + plan.interpreter +
                      "': " + std::strerror(error));
  }
  return Status::Ok();
}

// Sends `text` with `fds` attached (SCM_RIGHTS).
Status SendWithFds(int sock, const std::string& text, const int* fds,
                   size_t nfds) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  char control[CMSG_SPACE(sp::kDescriptors * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::Io(std::string("sendmsg: ") + std::strerror(errno));
  return Status::Ok();
}

}  // namespace

// A group without a use for a standby stops it.
void WorkerGroup::UseStandby(std::unique_ptr<Standby> standby) {
  standby.reset();
}

Result<std::unique_ptr<Standby>> Standby::Start(const StandbyPlan& plan) {
  if (Status s = os::MakeDirs(plan.dir); !s.ok()) return s;
  if (plan.argv.empty()) {  // Python's: its file first
    const std::string script = plan.dir + "/dtrun_standby.py";
    if (Status s = os::WriteFile(script, kStandbyFiles[0].text); !s.ok())
      return s;
  }
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return Status::Io(std::string("socketpair: ") + std::strerror(errno));
  }
  // The workers it forks are re-parented to this process when their
  // intermediate parent exits: dtrun then waits for them as for its own.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  pid_t pid = -1;
  Status s = SpawnStandby(plan, pair[1], &pid);
  close(pair[1]);
  if (!s.ok()) {
    close(pair[0]);
    return s;
  }
  return std::unique_ptr<Standby>(
      new Standby(pid, pair[0], plan.log_file, !plan.argv.empty()));
}

Standby::~Standby() {
  close(sock_);  // the standby's cue to exit
  // Still ours until the group reaps it: a SIGKILL cannot hit a reused pid.
  if (!exited_) kill(pid_, SIGKILL);
}

// One packet from the standby within `limit`; "" when none came yet.
Result<std::string> Standby::Receive(milliseconds limit) {
  pollfd p{sock_, POLLIN, 0};
  int n;
  do {
    n = poll(&p, 1, static_cast<int>(limit.count()));
  } while (n < 0 && errno == EINTR);
  if (n == 0) return std::string();
  std::string buf(sp::kMaxPacket, '\0');
  ssize_t got = recv(sock_, buf.data(), buf.size(), MSG_DONTWAIT);
  if (got <= 0) {
    return Status::Io("the standby exited (its output: " + log_file_ + ")");
  }
  buf.resize(static_cast<size_t>(got));
  return buf;
}

Result<bool> Standby::Ready() {
  if (ready_) return true;
  auto packet = Receive(milliseconds(0));
  if (!packet.ok()) return packet.status();
  if (packet->empty()) return false;
  auto j = nlohmann::json::parse(*packet, nullptr, false);
  if (!j.is_object())
    return Status::Invalid("the standby's answer is not JSON");
  if (!j.value(sp::kReady, false)) {
    return Status::Unavailable(
        j.value(sp::kWhy, std::string("no reason given")));
  }
  ready_ = true;
  import_seconds_ = j.value(sp::kSeconds, 0.0);
  return true;
}

Result<int> Standby::Fork(const WorkerSpec& spec, int out_fd, int err_fd) {
  nlohmann::json req = {{sp::kArgv, spec.argv},
                        {sp::kEnv, spec.env},
                        {sp::kCpus, spec.cpus},
                        {sp::kParent, static_cast<int>(getpid())}};
  const int fds[sp::kDescriptors] = {out_fd, err_fd};
  if (Status s = SendWithFds(sock_, req.dump(), fds, sp::kDescriptors); !s.ok())
    return s;
  auto packet = Receive(kForkLimit);
  if (!packet.ok()) return packet.status();
  if (packet->empty()) {
    return Status::Timeout("the standby did not fork a worker within " +
                           std::to_string(kForkLimit.count() / 1000) + " s");
  }
  auto j = nlohmann::json::parse(*packet, nullptr, false);
  if (j.is_object() && j.contains(sp::kPid) && j[sp::kPid].is_number_integer())
    return j[sp::kPid].get<int>();
  if (j.is_object() && j.contains(sp::kError) && j[sp::kError].is_string())
    return Status::Unavailable(j[sp::kError].get<std::string>());
  return Status::Unavailable("the standby's answer is not understood");
}

std::chrono::milliseconds StandbyWait(const LaunchConfig& config) {
  if (!config.multi_node()) return kStandbyWaitAlone;
  return std::min(kStandbyWaitAlone, config.rdzv_conf.keep_alive_interval / 2);
}

std::unique_ptr<Standby> StartStandby(const LaunchConfig& config,
                                      const EnvMap& base_env,
                                      const std::string& run_dir) {
  StandbyPlan plan;
  plan.interpreter = config.worker_argv[0];
  plan.dir = layout::StandbyDir(run_dir);
  plan.modules = config.standby_modules;
  EnvMap env = StandbyEnv(base_env, config.nproc_per_node);
  // The script's folder (or, for -m, the current one) comes first on its
  // path, as on the workers', so the user's own modules can be named.
  if (config.python_worker) {
    env[sp::kScriptVariable] = config.worker_argv[config.module ? 3 : 2];
    env[sp::kModuleVariable] = config.module ? "1" : "0";
  } else {
    plan.argv = config.worker_argv;
    env[sp::kFdVariable] = std::to_string(sp::kSocketFd);
  }
  plan.env = ToEnvStrings(env);
  plan.log_file = plan.dir + "/standby.log";
  auto standby = Standby::Start(plan);
  auto log = Logger("dtrun.agent");
  if (!standby.ok()) {
    log->warn("{}: {}; workers start cold",
              config.python_worker ? "--standby-import" : "--standby",
              standby.status().message());
    return nullptr;
  }
  (*standby)->set_restart_wait(StandbyWait(config));
  if (config.python_worker) {
    log->info("--standby-import: the standby (pid {}) imports {}",
              (*standby)->pid(), config.standby_import);
  } else {
    log->info("--standby: the standby (pid {}) starts {}", (*standby)->pid(),
              config.worker_argv[0]);
  }
  return std::move(*standby);
}

void AwaitWarmStandby(WorkerGroup* workers, SignalFd* signals,
                      const Clock* clock, const std::vector<int>& handled,
                      std::vector<int>* deferred) {
  using std::chrono::milliseconds;
  const milliseconds wait = workers->standby_wait();
  if (wait.count() <= 0) return;
  const TimePoint until = clock->Now() + wait;
  bool signalled = false;
  while (!signalled && workers->standby_wait().count() > 0) {
    auto left =
        std::chrono::duration_cast<milliseconds>(until - clock->Now()).count();
    if (left <= 0) break;
    std::vector<pollfd> fds;
    if (signals) fds.push_back({signals->fd(), POLLIN, 0});
    for (int fd : workers->output_fds()) fds.push_back({fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), static_cast<int>(left) + 1) < 0)
      continue;  // EINTR
    // A signal is kept, not handled: handling it may need the workers
    // this wait is about to start.
    for (const pollfd& p : fds) {
      if (!p.revents) continue;
      if (signals && p.fd == signals->fd()) {
        for (int signo : signals->Read()) {
          deferred->push_back(signo);
          signalled |= UseOf(signo, handled) != SignalUse::kChildren;
        }
      } else {
        workers->OnReadable(p.fd);
      }
    }
  }
}

}  // namespace dtrun::agent
