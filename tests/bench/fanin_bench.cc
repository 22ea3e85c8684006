// The workers' store at scale: N workers connect to one store at once and do
// what torch's init_process_group does there with NCCL: each SETs its own
// address, WAITs for and GETs rank 0's (the unique id rank 0 SETs), then the
// store barrier (ADD a counter, WAIT for the key the last arrival SETs).
// Every connection is a real TCP connection on loopback (sources spread over
// 127.0.0.1, .2, ... so no one address runs out of ports), driven by one epoll
// thread so that the figures measure the server; dtstore and libtorch's
// TCPStore server (tests/helpers/torch_store_host) each run in a process of
// their own, alternately. Per N: the time from the first connect to the
// last worker released, the time by which every connection was accepted,
// the server's CPU seconds and its peak resident memory. A run longer than
// --limit seconds is given up (reported as such); N beyond what the
// process's descriptor limit allows (server and client each hold N) is
// reported as not run.
//
// With the proxy (rendezvous/store_proxy.h): the same workers in nodes of
// 8, each node's behind a proxy of its own that holds one connection to
// dtstore (below, "Through proxies"); these run in forked node processes,
// so 100,000 workers fit the descriptor limit.
//
// --torch2-host "scripts/torch2-python tests/bench/torch_store_host.py":
// torch 2.x's own server too, its workers speaking the >= 2.2 dialect.
//
// Usage: fanin_bench --dtstore PATH [--torch-host PATH] [--torch2-host CMD]
// [--workers
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
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <asio.hpp>

#include "rendezvous/store_proxy.h"
#include "rendezvous/wire.h"
#include "tests/helpers/server_process.h"
#include "tests/helpers/wire_frame.h"

namespace dtrun::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
using Server = dtrun::testing::ServerProcess;
using dtrun::testing::CpuSeconds;

constexpr int kPerSource = 25000;  // connections per source address

// The workers' dialect: 1.13's, or >= 2.2's against torch 2.x's server.
Dialect g_dialect = Dialect::kTorch113;

std::string Frame(Op op, std::vector<std::string> keys,
                  std::vector<std::string> values = {}, int64_t number = 0) {
  return dtrun::testing::EncodeFrame(g_dialect, op, std::move(keys),
                                     std::move(values), number);
}

// Where one worker is in its init: each stage ends with one reply.
// (kPing: a torch 2.x client's VALIDATE and PING, answered before its
// first request, as torch's client does.)
enum class Stage {
  kConnecting,
  kPing,
  kWaitUid,
  kGetUid,
  kAdd,
  kWaitGo,
  kDone
};

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

// Starts a non-blocking connect from 127.0.0.(1 + i / kPerSource). The
// first 25,000 come from 127.0.0.1: torch 2.6's server looks up each
// client's name, and 127.0.0.2 has none in its root (a 5 s resolver
// timeout every few dozen connections).
// Where worker i connects: an IPv4 address (host order) and a port.
struct Target {
  uint32_t addr;
  uint16_t port;
};

// Sources start here: 127.0.0.1 directly (see StartConnect), 127.0.0.2
// through proxies, whose listeners hold ports on their own addresses.
uint32_t g_source_base = 0x7f000001;

int StartConnect(int i, Target to) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // The port is picked at connect, per destination: a bind-time pick would
  // collide with the last run's TIME_WAIT sockets.
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(g_source_base + i / kPerSource);
  bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src));
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(to.port);
  dst.sin_addr.s_addr = htonl(to.addr);
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
    case Stage::kPing:
      return in.size() >= 4 ? 4 : 0;
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

// Moves worker `w` (i of `n`) on by the reply of `size` bytes at the head of
// its input.
void Start(int i, Worker& w);

void Advance(int n, int i, Worker& w, size_t size) {
  const std::string bar = "/init/barrier", go = "/init/barrier/go";
  switch (w.stage) {
    case Stage::kPing:
      Start(i, w);
      break;
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
// Worker i's requests up to its first WAIT.
void Start(int i, Worker& w) {
  std::string first =
      Frame(Op::kSet, {"/init/addr/" + std::to_string(i)}, {"127.0.0.1:29500"});
  if (i == 0) first += Frame(Op::kSet, {"/init/uid"}, {std::string(128, 'u')});
  first += Frame(Op::kWait, {"/init/uid"});
  SendAll(w.fd, first);
  w.stage = Stage::kWaitUid;
}

void Begin(int i, Worker& w) {
  if (g_dialect != Dialect::kTorch2) return Start(i, w);
  std::string hello;
  Request v;
  v.op = Op::kValidate;
  v.word = kValidateMagic;
  EncodeRequest(v, Dialect::kTorch2, &hello);
  v.op = Op::kPing;
  v.word = static_cast<uint32_t>(i);
  EncodeRequest(v, Dialect::kTorch2, &hello);
  SendAll(w.fd, hello);
  w.stage = Stage::kPing;
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

// Seconds on the monotonic clock, comparable across processes.
double Now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// What one driver saw: when its first connect began, when its last
// connection was up and its last worker released (absolute, Now()).
struct Span {
  double start = 0, accepted = -1, end = -1;
  int done = 0;
};

// Registers worker i's connection with epoll (data: its index here).
bool Open(int ep, int i, Target to, Worker* w, uint32_t local) {
  w->fd = StartConnect(i, to);
  if (w->fd < 0) {
    std::fprintf(stderr, "connect %d: %s\n", i, std::strerror(errno));
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT;
  ev.data.u32 = local;
  epoll_ctl(ep, EPOLL_CTL_ADD, w->fd, &ev);
  return true;
}

// One readiness event of worker `w` (global index i of n).
void OnEvent(int ep, int i, int n, Worker& w, uint32_t events, uint32_t local,
             Span* s, int* connected, int count, std::vector<char>& buf) {
  if (w.stage == Stage::kConnecting && (events & EPOLLOUT)) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = local;
    epoll_ctl(ep, EPOLL_CTL_MOD, w.fd, &ev);
    if (++*connected == count) s->accepted = Now();
    Begin(i, w);
  }
  if (!(events & EPOLLIN)) return;
  ssize_t got = recv(w.fd, buf.data(), buf.size(), 0);
  if (got <= 0) return;
  w.in.append(buf.data(), static_cast<size_t>(got));
  for (size_t size; (size = ReplySize(w.stage, w.in)) > 0;) {
    Advance(n, i, w, size);
    if (w.stage == Stage::kDone && ++s->done == count) s->end = Now();
  }
}

// Workers first..first+count-1 of n, worker i connecting to target_of(i),
// on one epoll thread, until all are released or `limit` seconds passed.
template <typename TargetOf>
Span Drive(int first, int count, int n, TargetOf target_of, double limit) {
  Span s;
  std::vector<Worker> ws(static_cast<size_t>(count));
  int ep = epoll_create1(0);
  s.start = Now();
  for (int k = 0; k < count; ++k) {
    if (!Open(ep, first + k, target_of(first + k), &ws[k], k)) return s;
  }
  int connected = 0;
  std::vector<epoll_event> events(1024);
  std::vector<char> buf(1 << 16);
  while (s.done < count && Now() < s.start + limit) {
    int k = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 100);
    for (int e = 0; e < k; ++e) {
      const uint32_t local = events[e].data.u32;
      OnEvent(ep, first + static_cast<int>(local), n, ws[local],
              events[e].events, local, &s, &connected, count, buf);
    }
  }
  for (auto& w : ws) close(w.fd);
  close(ep);
  return s;
}

Result FanIn(const Server& srv, int n, double limit) {
  Result r;
  const double cpu0 = CpuSeconds(srv.pid);
  Span s = Drive(
      0, n, n,
      [&srv](int) {
        return Target{0x7f000001, srv.port};
      },
      limit);
  r.done = s.done;
  if (s.end > 0) r.seconds = s.end - s.start;
  if (s.accepted > 0) r.accepted = s.accepted - s.start;
  r.cpu = CpuSeconds(srv.pid) - cpu0;
  r.rss_mb = PeakRssMb(srv.pid);
  return r;
}

// --- Through proxies: nodes of kPerNode workers, each node's workers
// connecting to its own StoreProxy, which holds one connection to the
// store. Node processes (forked, each within the descriptor limit: per
// node 2 x kPerNode worker ends, the store connection and the listener)
// run their nodes' proxies on one asio thread and drive their workers on
// another; they start together when the parent closes the go pipe.

constexpr int kPerNode = 8;

struct Pipes {
  int ready[2], go[2], result[2];
};

[[noreturn]] void NodeProcess(uint16_t store_port, int first_node, int nodes,
                              int n, double limit, const Pipes& p) {
  asio::io_context io(1);
  auto work = asio::make_work_guard(io);
  std::thread loop([&io] { io.run(); });
  std::vector<std::unique_ptr<StoreProxy>> proxies;
  for (int k = 0; k < nodes; ++k) {
    StoreProxyOptions o;
    o.upstream_host = "127.0.0.1";
    o.upstream_port = store_port;
    o.connect_timeout = std::chrono::seconds(120);
    // Listeners spread over 127.1.x.1, 4,096 an address: on one address
    // they and the last run's TIME_WAIT ends outgrow its ephemeral ports.
    o.listen_host = "127.1." + std::to_string((first_node + k) / 4096) + ".1";
    auto proxy = StoreProxy::Start(o, &io);
    if (!proxy.ok()) {
      std::fprintf(stderr, "%s\n", proxy.status().message().c_str());
      write(p.ready[1], "F", 1);
      _exit(1);
    }
    proxies.push_back(std::move(*proxy));
  }
  write(p.ready[1], "R", 1);
  char c;
  while (read(p.go[0], &c, 1) > 0) {
  }
  const int first = first_node * kPerNode;
  const int count = std::min(nodes * kPerNode, n - first);
  Span s = Drive(
      first, count, n,
      [&](int i) {
        const int node = i / kPerNode;
        return Target{0x7f010001u + (static_cast<uint32_t>(node / 4096) << 8),
                      proxies[node - first_node]->port()};
      },
      limit);
  write(p.result[1], &s, sizeof(s));
  _exit(0);  // the proxies go with the process
}

// Forks the node processes; false (with them reaped) if one failed to
// start its proxies.
bool StartNodes(const Server& srv, int n, int fd_room, double limit,
                const Pipes& p, std::vector<pid_t>* pids) {
  const int nodes = (n + kPerNode - 1) / kPerNode;
  const int per_proc = std::max(1, fd_room / (2 * kPerNode + 3));
  std::fflush(nullptr);  // or the children would print it again
  for (int first = 0; first < nodes; first += per_proc) {
    pid_t pid = fork();
    if (pid == 0) {
      close(p.go[1]);
      NodeProcess(srv.port, first, std::min(per_proc, nodes - first), n, limit,
                  p);
    }
    pids->push_back(pid);
  }
  bool ok = true;
  for (size_t k = 0; k < pids->size(); ++k) {
    char c = 'F';
    if (read(p.ready[0], &c, 1) != 1 || c != 'R') ok = false;
  }
  return ok;
}

// `setup`: fork -> every proxy connected (not part of the fan-in).
Result FanInProxied(const Server& srv, int n, int fd_room, double limit,
                    double* setup, int* procs) {
  Result r;
  Pipes p;
  pipe(p.ready);
  pipe(p.go);
  pipe(p.result);
  std::vector<pid_t> pids;
  const double t0 = Now();
  bool ok = StartNodes(srv, n, fd_room, limit, p, &pids);
  *setup = Now() - t0;
  *procs = static_cast<int>(pids.size());
  const double cpu0 = CpuSeconds(srv.pid);
  close(p.go[1]);  // go
  double start = 1e300, accepted = 0, end = 0;
  for (size_t k = 0; ok && k < pids.size(); ++k) {
    Span s;
    if (read(p.result[0], &s, sizeof(s)) != sizeof(s)) break;
    start = std::min(start, s.start);
    accepted = s.accepted < 0 ? 1e300 : std::max(accepted, s.accepted);
    end = s.end < 0 ? 1e300 : std::max(end, s.end);
    r.done += s.done;
  }
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  for (int fd : {p.ready[0], p.ready[1], p.go[0], p.result[0], p.result[1]})
    close(fd);
  if (r.done == n && end < 1e300) r.seconds = end - start;
  if (accepted < 1e300 && accepted > 0) r.accepted = accepted - start;
  r.cpu = CpuSeconds(srv.pid) - cpu0;
  r.rss_mb = PeakRssMb(srv.pid);
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

// The servers a side runs: dtstore, torch 1.13's, torch 2.x's (a command
// line, split at spaces).
struct Hosts {
  std::string dtstore, torch, torch2;
};

std::vector<std::string> Words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// One measurement: side 0 dtstore, 1 torch 1.13's server (when given), 2
// dtstore with the workers behind proxies (nodes of kPerNode), 3 torch
// 2.x's server (when given; the workers speak its dialect).
void RunSide(int side, int round, int n, int most, double limit,
             const Hosts& hosts) {
  if ((side == 1 && hosts.torch.empty()) || (side == 3 && hosts.torch2.empty()))
    return;
  if (side != 2 && n > most) {
    if (side == 0 && round == 0) {
      std::printf(
          "| - | %d | not run: needs %d descriptors in one process, "
          "this machine allows %d (RLIMIT_NOFILE) | | | |\n",
          n, n + 256, most + 256);
    }
    return;
  }
  Server s = side == 1   ? dtrun::testing::SpawnServer({hosts.torch})
             : side == 3 ? dtrun::testing::SpawnServer(Words(hosts.torch2))
                         : dtrun::testing::SpawnServer(
                               {hosts.dtstore, "--host", "127.0.0.1", "--port",
                                "0", "--log-level", "error"});
  g_dialect = side == 3 ? Dialect::kTorch2 : Dialect::kTorch113;
  g_source_base = side == 2 ? 0x7f000002 : 0x7f000001;
  if (s.pid < 0 || s.port == 0) {
    std::fprintf(stderr, "could not start the server\n");
    std::exit(1);
  }
  if (side == 2) {
    double setup = 0;
    int procs = 0;
    Result r = FanInProxied(s, n, most, limit, &setup, &procs);
    char name[160];
    std::snprintf(name, sizeof(name),
                  "dtstore, %d proxies (%d node processes; proxies connected "
                  "in %.2f s before)",
                  (n + kPerNode - 1) / kPerNode, procs, setup);
    PrintRow(name, n, r, limit);
  } else {
    PrintRow(side == 0   ? "dtstore"
             : side == 1 ? "torch 1.13"
                         : "torch 2.x",
             n, FanIn(s, n, limit), limit);
  }
  Stop(s);
}

}  // namespace
}  // namespace dtrun::rendezvous

int main(int argc, char** argv) {
  using namespace dtrun::rendezvous;
  Hosts hosts;
  std::vector<int> sizes = {1024, 8192, 65536, 100000};
  int rounds = 1;
  double limit = 120;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--dtstore") {
      hosts.dtstore = v;
    } else if (a == "--torch-host") {
      hosts.torch = v;
    } else if (a == "--torch2-host") {
      hosts.torch2 = v;
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
  if (hosts.dtstore.empty()) {
    std::fprintf(stderr,
                 "usage: fanin_bench --dtstore PATH [--torch-host PATH] "
                 "[--torch2-host CMD] "
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
    for (int round = 0; round < rounds; ++round) {
      // Alternating which side goes first.
      for (int k = 0; k < 4; ++k)
        RunSide((k + round) % 4, round, n, most, limit, hosts);
    }
  }
  return 0;
}
