// The native standby (standby_worker.h). One request at a time: the
// standby forks A, A forks the worker and exits, so the worker is
// re-parented to dtrun (a child subreaper), which waits for it and signals
// its process group as for a worker it starts itself.
#include "lib/standby_worker.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rendezvous/standby_protocol.h"

extern char** environ;

namespace dtrun::train {
namespace {

namespace sp = standby_protocol;

// Read once by a program's start (the loader, malloc, OpenMP, BLAS,
// torch's static initialisers): a worker forked from the standby has the
// standby's, so they must match.
constexpr const char* kStartOnly[] = {"LD_",  "MALLOC_", "GLIBC_TUNABLES",
                                      "OMP_", "MKL_",    "OPENBLAS_",
                                      "KMP_", "TORCH_",  "PYTORCH_"};

// What dtrun asks for, read whole before anything is forked.
struct Request {
  std::vector<std::string> argv, env;  // env: "K=V"
  std::vector<int> cpus;               // empty: any
  pid_t parent = 0;                    // dtrun: the worker's parent to be
};

// The worker's own argv and environment outlive the request.
std::vector<std::string>* worker_args = nullptr;
std::vector<char*>* worker_argv = nullptr;

// The variables of `env` that a program reads only as it starts.
std::map<std::string, std::string> StartOnly(
    const std::vector<std::string>& env) {
  std::map<std::string, std::string> out;
  for (const auto& kv : env) {
    for (const char* prefix : kStartOnly) {
      if (kv.compare(0, std::strlen(prefix), prefix) == 0) {
        const size_t eq = kv.find('=');
        if (eq != std::string::npos) out[kv.substr(0, eq)] = kv.substr(eq + 1);
        break;
      }
    }
  }
  return out;
}

// The standby's environment as it started: what each worker's start-only
// variables are compared with.
std::vector<std::string> OwnEnvironment() {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) out.emplace_back(*e);
  return out;
}

// This process's threads: a fork copies only the one that calls it.
int Threads() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// Why forking `req`'s worker would be unsafe or wrong, or "".
std::string Refusal(const Request& req,
                    const std::vector<std::string>& start_env) {
  const auto mine = StartOnly(start_env);
  const auto theirs = StartOnly(req.env);
  for (const auto* side : {&mine, &theirs}) {
    for (const auto& [k, v] : *side) {
      auto a = mine.find(k), b = theirs.find(k);
      const std::string ours = a == mine.end() ? "(unset)" : a->second;
      const std::string wanted = b == theirs.end() ? "(unset)" : b->second;
      if (ours != wanted) {
        return k + " differs between the worker ('" + wanted +
               "') and the standby ('" + ours + "'), and is read at start";
      }
    }
  }
  const int threads = Threads();
  if (threads != 1) {
    return "the standby runs " + std::to_string(threads) +
           " threads (a fork copies only one)";
  }
  return "";
}

// One packet to dtrun; when dtrun is gone the next Receive says so.
void Send(int sock, const nlohmann::json& j) {
  const std::string text = j.dump();
  ssize_t n;
  do {
    n = send(sock, text.data(), text.size(), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
}

// One request and its two descriptors; false when dtrun's end closed.
bool Receive(int sock, std::string* text, std::vector<int>* fds) {
  text->assign(sp::kMaxPacket, '\0');
  iovec iov{text->data(), text->size()};
  char control[CMSG_SPACE(sp::kDescriptors * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  text->resize(static_cast<size_t>(n));
  fds->clear();
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds->push_back(fd);
    }
  }
  return true;
}

// In the forked worker: its process group, dtrun as its parent and death
// signal, its descriptors, signal mask, CPUs, environment and argv.
void Settle(const Request& req, const std::vector<int>& fds, int sock,
            int* argc, char*** argv) {
  setpgid(0, 0);
  const pid_t parent = req.parent;
  for (int waited_ms = 0; getppid() != parent; ++waited_ms) {
    if (waited_ms > 5000) _exit(127);
    usleep(1000);
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  dup2(fds[0], 1);
  dup2(fds[1], 2);
  close(fds[0]);
  close(fds[1]);
  close(sock);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (!req.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : req.cpus) CPU_SET(c, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  clearenv();
  for (const auto& kv : req.env) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos)
      setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  worker_args = new std::vector<std::string>(req.argv);
  worker_argv = new std::vector<char*>();
  for (auto& a : *worker_args) worker_argv->push_back(a.data());
  worker_argv->push_back(nullptr);
  *argc = static_cast<int>(worker_args->size());
  *argv = worker_argv->data();
}

// Forks `req`'s worker: its pid here (or -1), and in the worker itself
// returns 0 after settling it.
pid_t Fork(const Request& req, const std::vector<int>& fds, int sock, int* argc,
           char*** argv) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return -1;
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t a = fork();
  if (a == 0) {
    close(pipe_fds[0]);
    const pid_t b = fork();
    if (b == 0) {
      close(pipe_fds[1]);
      Settle(req, fds, sock, argc, argv);
      return 0;
    }
    ssize_t ignored = write(pipe_fds[1], &b, sizeof(b));
    (void)ignored;
    _exit(b > 0 ? 0 : 1);
  }
  close(pipe_fds[1]);
  pid_t b = -1;
  if (a > 0 && read(pipe_fds[0], &b, sizeof(b)) != sizeof(b)) b = -1;
  close(pipe_fds[0]);
  if (a > 0) waitpid(a, nullptr, 0);
  return b;
}

// Seconds since this process started (its loader and static initialisers:
// what each forked worker skips).
double SecondsSinceStart() {
  std::FILE* f = std::fopen("/proc/self/stat", "r");
  if (!f) return 0;
  char buf[2048] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const char* p = std::strrchr(buf, ')');
  if (!p || n == 0) return 0;
  // Field 22 (starttime, in clock ticks since boot); field 3 follows ") ".
  int field = 2;
  unsigned long long ticks = 0;
  for (const char* q = p + 1; *q; ++q) {
    if (*q == ' ' && ++field == 22) {
      ticks = std::strtoull(q + 1, nullptr, 10);
      break;
    }
  }
  timespec now{};
  clock_gettime(CLOCK_BOOTTIME, &now);
  return now.tv_sec + now.tv_nsec * 1e-9 -
         static_cast<double>(ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// `text` and `fds` as a Request; "" or what is wrong with them.
std::string Parse(const std::string& text, const std::vector<int>& fds,
                  Request* req) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || fds.size() != sp::kDescriptors)
    return "bad request (not the JSON and two descriptors dtrun sends)";
  try {
    req->argv = j.at(sp::kArgv).get<std::vector<std::string>>();
    req->env = j.at(sp::kEnv).get<std::vector<std::string>>();
    req->cpus = j.value(sp::kCpus, std::vector<int>{});
    req->parent = j.at(sp::kParent).get<int>();
  } catch (const nlohmann::json::exception& e) {
    return std::string("bad request: ") + e.what();
  }
  if (req->argv.empty()) return "bad request: no argv";
  return "";
}

// Answers one request: forks its worker or says why not. True in the
// worker itself.
bool Answer(const std::string& text, const std::vector<int>& fds, int sock,
            const std::vector<std::string>& start_env, int* argc,
            char*** argv) {
  nlohmann::json reply;
  Request req;
  std::string why = Parse(text, fds, &req);
  if (why.empty()) why = Refusal(req, start_env);
  if (why.empty()) {
    const pid_t pid = Fork(req, fds, sock, argc, argv);
    if (pid == 0) return true;
    if (pid < 0) why = std::string("fork: ") + std::strerror(errno);
    reply = {{sp::kPid, pid}};
  }
  for (int fd : fds) close(fd);
  Send(sock, why.empty() ? reply : nlohmann::json{{sp::kError, why}});
  return false;
}

}  // namespace

void ServeStandbyIfAsked(int* argc, char*** argv) {
  const char* fd_text = std::getenv(sp::kFdVariable);
  if (!fd_text) return;
  const int sock = std::atoi(fd_text);
  unsetenv(sp::kFdVariable);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  const std::vector<std::string> start_env = OwnEnvironment();
  const int threads = Threads();
  if (threads != 1) {
    Send(sock,
         {{sp::kReady, false},
          {sp::kWhy, "the program runs " + std::to_string(threads) +
                         " threads before main (a fork copies only one)"}});
    _exit(0);
  }
  Send(sock, {{sp::kReady, true}, {sp::kSeconds, SecondsSinceStart()}});
  std::string text;
  std::vector<int> fds;
  while (Receive(sock, &text, &fds)) {
    if (Answer(text, fds, sock, start_env, argc, argv)) return;  // the worker
  }
  _exit(0);  // dtrun closed its end: the job is over
}

}  // namespace dtrun::train
