// The workers' store at scale: N workers connect to one store at once and do
// what torch's init_process_group does there with NCCL: each SETs its own
// address, WAITs for and GETs rank 0's (the unique id rank 0 SETs), then the
// store barrier (ADD a counter, WAIT for the key the last arrival SETs).
// Every connection is a real TCP connection on loopback (sources spread over
// 127.0.0.2... so no one address runs out of ports), driven by one epoll
// thread so that the figures measure the server; dtstore and libtorch's
// TCPStore server (tests/helpers/torch_store_host) each run in a process of
// their own, alternately. Per N: the time from the first connect to the
// last worker released, the time by which every connection was accepted,
// the server's CPU seconds and its peak resident memory. A run longer than
// --limit seconds is given up (reported as such); N beyond what the
// process's descriptor limit allows (server and client each hold N) is
// reported as not run.
//
// Usage: fanin_bench --dtstore PATH [--torch-host PATH] [--workers
//                    1024,8192,65536,100000] [--rounds 1] [--limit 120]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "rendezvous/wire.h"
#include "tests/helpers/server_process.h"
#include "tests/helpers/wire_frame.h"

namespace dtrun::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
using Server = dtrun::testing::ServerProcess;
using dtrun::testing::CpuSeconds;

constexpr int kPerSource = 25000;  // connections per source address

std::string Frame(Op op, std::vector<std::string> keys,
                  std::vector<std::string> values = {}, int64_t number = 0) {
  return dtrun::testing::EncodeFrame(Dialect::kTorch113, op, std::move(keys),
                                     std::move(values), number);
}

// Where one worker is in its init: each stage ends with one reply.
enum class Stage { kConnecting, kWaitUid, kGetUid, kAdd, kWaitGo, kDone };

struct Worker {
  int fd = -1;
  Stage stage = Stage::kConnecting;
  std::string in;  // reply bytes not consumed yet
};

void SendAll(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return;
    }
  }
}

// Starts a non-blocking connect from 127.0.0.(2 + i / kPerSource).
int StartConnect(int i, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // The port is picked at connect, per destination: a bind-time pick would
  // collide with the last run's TIME_WAIT sockets.
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(0x7f000002 + i / kPerSource);
  bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src));
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst));
  if (rc != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

// The size of the reply a stage waits for, once `in` holds its head; 0
// while more bytes are needed.
size_t ReplySize(Stage stage, const std::string& in) {
  switch (stage) {
    case Stage::kWaitUid:
    case Stage::kWaitGo:
      return in.empty() ? 0 : 1;
    case Stage::kAdd:
      return in.size() >= 8 ? 8 : 0;
    case Stage::kGetUid: {
      if (in.size() < 8) return 0;
      uint64_t len = 0;
      size_t pos = 0;
      GetU64(in, &pos, &len);
      return in.size() >= 8 + len ? 8 + len : 0;
    }
    default:
      return 0;
  }
}

struct Result {
  double seconds = -1;   // first connect -> last release; -1: gave up
  double accepted = -1;  // first connect -> every connection writable
  double cpu = 0;        // the server's CPU seconds
  double rss_mb = 0;     // the server's peak resident set
  int done = 0;
};

// Moves worker `w` (of `n`) on by the reply of `size` bytes at the head of
// its input.
void Advance(int n, Worker& w, size_t size) {
  const std::string bar = "/init/barrier", go = "/init/barrier/go";
  switch (w.stage) {
    case Stage::kWaitUid:
      SendAll(w.fd, Frame(Op::kGet, {"/init/uid"}));
      w.stage = Stage::kGetUid;
      break;
    case Stage::kGetUid:
      SendAll(w.fd, Frame(Op::kAdd, {bar}, {}, 1));
      w.stage = Stage::kAdd;
      break;
    case Stage::kAdd: {
      int64_t count = 0;
      size_t pos = 0;
      GetI64(w.in, &pos, &count);
      std::string next;
      if (count == n) next += Frame(Op::kSet, {go}, {"1"});
      next += Frame(Op::kWait, {go});
      SendAll(w.fd, next);
      w.stage = Stage::kWaitGo;
      break;
    }
    case Stage::kWaitGo:
      w.stage = Stage::kDone;
      break;
    default:
      break;
  }
  w.in.erase(0, size);
}

// A connection is up: the worker's first requests.
void Begin(int i, Worker& w) {
  std::string first =
      Frame(Op::kSet, {"/init/addr/" + std::to_string(i)}, {"127.0.0.1:29500"});
  if (i == 0) first += Frame(Op::kSet, {"/init/uid"}, {std::string(128, 'u')});
  first += Frame(Op::kWait, {"/init/uid"});
  SendAll(w.fd, first);
  w.stage = Stage::kWaitUid;
}

double PeakRssMb(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (f >> key) {
    if (key == "VmHWM:") {
      double kb = 0;
      f >> kb;
      return kb / 1024;
    }
    std::getline(f, key);
  }
  return 0;
}

Result FanIn(const Server& srv, int n, double limit) {
  Result r;
  std::vector<Worker> ws(static_cast<size_t>(n));
  int ep = epoll_create1(0);
  const double cpu0 = CpuSeconds(srv.pid);
  const auto t0 = Clock::now();
  const auto give_up = t0 + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(limit));
  for (int i = 0; i < n; ++i) {
    ws[i].fd = StartConnect(i, srv.port);
    if (ws[i].fd < 0) {
      std::fprintf(stderr, "connect %d: %s\n", i, std::strerror(errno));
      return r;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.u32 = static_cast<uint32_t>(i);
    epoll_ctl(ep, EPOLL_CTL_ADD, ws[i].fd, &ev);
  }
  int connected = 0;
  std::vector<epoll_event> events(1024);
  std::vector<char> buf(1 << 16);
  while (r.done < n && Clock::now() < give_up) {
    int k = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 100);
    for (int e = 0; e < k; ++e) {
      const int i = static_cast<int>(events[e].data.u32);
      Worker& w = ws[static_cast<size_t>(i)];
      if (w.stage == Stage::kConnecting && (events[e].events & EPOLLOUT)) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u32 = static_cast<uint32_t>(i);
        epoll_ctl(ep, EPOLL_CTL_MOD, w.fd, &ev);
        if (++connected == n)
          r.accepted = std::chrono::duration<double>(Clock::now() - t0).count();
        Begin(i, w);
      }
      if (!(events[e].events & EPOLLIN)) continue;
      ssize_t got = recv(w.fd, buf.data(), buf.size(), 0);
      if (got <= 0) continue;
      w.in.append(buf.data(), static_cast<size_t>(got));
      for (size_t size; (size = ReplySize(w.stage, w.in)) > 0;) {
        Advance(n, w, size);
        if (w.stage == Stage::kDone) ++r.done;
      }
    }
  }
  if (r.done == n)
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.cpu = CpuSeconds(srv.pid) - cpu0;
  r.rss_mb = PeakRssMb(srv.pid);
  for (auto& w : ws) close(w.fd);
  close(ep);
  return r;
}

void Stop(const Server& s) {
  kill(s.pid, SIGKILL);
  waitpid(s.pid, nullptr, 0);
}

// Enough descriptors for n connections here and n in the server (which
// inherits the limit): raised as far as the hard limit allows; returns the
// most workers that fit.
int RaiseFdLimit(int n) {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  rlimit want = lim;
  want.rlim_cur = want.rlim_max =
      std::max<rlim_t>(lim.rlim_max, static_cast<rlim_t>(n) + 256);
  if (setrlimit(RLIMIT_NOFILE, &want) != 0) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  getrlimit(RLIMIT_NOFILE, &lim);
  return static_cast<int>(lim.rlim_cur) - 256;
}

void PrintRow(const char* name, int n, const Result& r, double limit) {
  if (r.seconds < 0) {
    std::printf(
        "| %s | %d | gave up after %.0f s (%d released) | | %.1f | %.0f |\n",
        name, n, limit, r.done, r.cpu, r.rss_mb);
  } else {
    std::printf("| %s | %d | %.2f | %.2f | %.1f | %.0f |\n", name, n, r.seconds,
                r.accepted, r.cpu, r.rss_mb);
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace dtrun::rendezvous

int main(int argc, char** argv) {
  using namespace dtrun::rendezvous;
  std::string dtstore, torch_host;
  std::vector<int> sizes = {1024, 8192, 65536, 100000};
  int rounds = 1;
  double limit = 120;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--dtstore") {
      dtstore = v;
    } else if (a == "--torch-host") {
      torch_host = v;
    } else if (a == "--workers") {
      sizes.clear();
      for (size_t at = 0; at < v.size();) {
        size_t comma = v.find(',', at);
        sizes.push_back(std::atoi(v.substr(at, comma - at).c_str()));
        at = comma == std::string::npos ? v.size() : comma + 1;
      }
    } else if (a == "--rounds") {
      rounds = std::atoi(v.c_str());
    } else if (a == "--limit") {
      limit = std::atof(v.c_str());
    }
  }
  if (dtstore.empty()) {
    std::fprintf(stderr,
                 "usage: fanin_bench --dtstore PATH [--torch-host PATH] "
                 "[--workers 1024,8192] [--rounds R] [--limit S]\n");
    return 2;
  }
  const int most = RaiseFdLimit(*std::max_element(sizes.begin(), sizes.end()));
  signal(SIGPIPE, SIG_IGN);
  std::printf(
      "| server | workers | first connect -> last released (s) | all "
      "accepted (s) | server CPU (s) | server peak RSS (MB) |\n"
      "|---|---|---|---|---|---|\n");
  for (int n : sizes) {
    if (n > most) {
      std::printf(
          "| - | %d | not run: needs %d descriptors in one process, "
          "this machine allows %d (RLIMIT_NOFILE) | | | |\n",
          n, n + 256, most + 256);
      continue;
    }
    for (int round = 0; round < rounds; ++round) {
      // Alternating which server goes first.
      for (int side = 0; side < 2; ++side) {
        bool ours = (side + round) % 2 == 0;
        if (!ours && torch_host.empty()) continue;
        Server s = ours ? dtrun::testing::SpawnServer(
                              {dtstore, "--host", "127.0.0.1", "--port", "0",
                               "--log-level", "error"})
                        : dtrun::testing::SpawnServer({torch_host});
        if (s.pid < 0 || s.port == 0) {
          std::fprintf(stderr, "could not start the %s server\n",
                       ours ? "dtstore" : "torch");
          return 1;
        }
        PrintRow(ours ? "dtstore" : "torch 1.13", n, FanIn(s, n, limit), limit);
        Stop(s);
      }
    }
  }
  return 0;
}
