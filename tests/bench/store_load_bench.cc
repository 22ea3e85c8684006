// Server-bound store benchmark: one thread, epoll, the raw c10d protocol,
// C connections each keeping D requests in flight, against dtstore and
// libtorch's TCPStore server (tests/helpers/torch_store_host), each in a
// process of its own. The client does little per request, so the figures
// measure the servers, not client threads sharing the cores.
//   set/get/add: ops/s and server CPU (utime+stime from /proc) per op; SET
//     has no reply, so each batch of D SETs ends with a GETNUMKEYS fence
//   get 1 MiB: the same with a 1 MiB value
//   wait release: one connection WAITs on a key, another SETs it; from the
//     SET's send to the WAIT's reply, median
//   barrier: N connections each ADD a counter and WAIT; the last sets the key
// Rows are medians of --rounds paired rounds (dtstore, then torch's).
//
// Usage: store_load_bench --dtstore PATH --torch-host PATH [--seconds 1]
//                         [--rounds 3] [--conns 8] [--depth 32] [--dialect
//                         113|2] [--pin CLIENT_CPU,SERVER_CPU]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
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
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "rendezvous/wire.h"
#include "tests/helpers/server_process.h"
#include "tests/helpers/wire_frame.h"

namespace dtrun::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
Dialect g_dialect = Dialect::kTorch113;

using Server = dtrun::testing::ServerProcess;
using dtrun::testing::CpuSeconds;

std::string Frame(Op op, std::vector<std::string> keys,
                  std::vector<std::string> values = {}, int64_t number = 0) {
  return dtrun::testing::EncodeFrame(g_dialect, op, std::move(keys),
                                     std::move(values), number);
}

// A non-blocking connection; a torch2-dialect one starts with VALIDATE.
int Connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  if (g_dialect == Dialect::kTorch2) {
    Request v;
    v.op = Op::kValidate;
    v.word = kValidateMagic;
    std::string bytes;
    EncodeRequest(v, g_dialect, &bytes);
    send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n > 0)
      off += static_cast<size_t>(n);
    else if (n < 0 && errno != EAGAIN && errno != EINTR)
      return;
  }
}

// Blocking read of exactly n bytes.
bool RecvN(int fd, size_t n, std::string* out) {
  out->resize(n);
  size_t got = 0;
  while (got < n) {
    ssize_t k = recv(fd, out->data() + got, n - got, 0);
    if (k <= 0) return false;
    got += static_cast<size_t>(k);
  }
  return true;
}

// Counts replies in a byte stream without keeping their bodies: fixed
// `size` bytes each, or (size < 0) a u64 length then that many bytes.
struct ReplyCounter {
  int size = 0;
  std::string header;  // bytes of the current reply's fixed part
  uint64_t skip = 0;   // body bytes still to pass over
  // Consumes `in`; returns how many replies completed.
  int Feed(const char* in, size_t n) {
    int done = 0;
    size_t head = size >= 0 ? static_cast<size_t>(size) : 8;
    while (n > 0) {
      if (skip > 0) {
        size_t k = std::min<uint64_t>(skip, n);
        skip -= k, in += k, n -= k;
        if (skip == 0) ++done;
        continue;
      }
      size_t k = std::min(head - header.size(), n);
      header.append(in, k);
      in += k, n -= k;
      if (header.size() < head) break;
      if (size < 0) {
        size_t pos = 0;
        GetU64(header, &pos, &skip);
        if (skip == 0) ++done;
      } else {
        ++done;
      }
      header.clear();
    }
    return done;
  }
};

struct Throughput {
  double ops_per_s = 0, cpu_us_per_op = 0;
};

// C connections, each with `depth` batches in flight; a batch is `per_batch`
// operations ending in one reply of kind `reply_size`.
Throughput Pipelined(const Server& srv, int conns, int depth, double seconds,
                     const std::string& batch, int per_batch, int reply_size) {
  int ep = epoll_create1(0);
  struct Conn {
    int fd;
    ReplyCounter replies;
    int inflight = 0;
  };
  std::vector<Conn> cs(conns);
  for (auto& c : cs) c.replies.size = reply_size;
  std::string burst;
  for (int d = 0; d < depth; ++d) burst += batch;
  for (int i = 0; i < conns; ++i) {
    cs[i].fd = Connect(srv.port);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = i;
    epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev);
  }
  double cpu0 = CpuSeconds(srv.pid);
  auto t0 = Clock::now();
  auto stop = t0 + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>(seconds));
  for (auto& c : cs) {
    SendAll(c.fd, burst);
    c.inflight = depth;
  }
  uint64_t done = 0;
  int open = conns;
  std::vector<epoll_event> events(64);
  std::vector<char> buf(4 << 20);
  while (open > 0) {
    int k = epoll_wait(ep, events.data(), events.size(), 10000);
    if (k <= 0) break;
    bool more = Clock::now() < stop;
    for (int e = 0; e < k; ++e) {
      Conn& c = cs[events[e].data.u32];
      ssize_t got = recv(c.fd, buf.data(), buf.size(), 0);
      if (got <= 0) continue;
      int replies = c.replies.Feed(buf.data(), static_cast<size_t>(got));
      done += static_cast<uint64_t>(replies) * per_batch;
      c.inflight -= replies;
      if (more && replies > 0) {
        std::string again;
        for (int r = 0; r < replies; ++r) again += batch;
        c.inflight += replies;
        SendAll(c.fd, again);
      }
      if (c.inflight == 0) --open;
    }
  }
  double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  double cpu = CpuSeconds(srv.pid) - cpu0;
  for (auto& c : cs) close(c.fd);
  close(ep);
  Throughput t;
  t.ops_per_s = done / elapsed;
  t.cpu_us_per_op = done ? cpu * 1e6 / done : 0;
  return t;
}

double WaitRelease(const Server& srv, int reps) {
  int a = Connect(srv.port), b = Connect(srv.port);
  std::vector<double> lat;
  std::string reply;
  for (int i = 0; i < reps; ++i) {
    std::string key = "/release" + std::to_string(i);
    SendAll(a, Frame(Op::kWait, {key}));
    usleep(1000);  // the WAIT is registered before the SET arrives
    auto t0 = Clock::now();
    SendAll(b, Frame(Op::kSet, {key}, {"1"}));
    if (!RecvN(a, 1, &reply)) break;
    lat.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  close(a);
  close(b);
  std::sort(lat.begin(), lat.end());
  return lat.empty() ? 0 : lat[lat.size() / 2];
}

// Milliseconds for n connections to ADD and WAIT until the last sets the key.
double Barrier(const Server& srv, int n, int round) {
  std::string key =
      "/barrier" + std::to_string(n) + "_" + std::to_string(round);
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) fds.push_back(Connect(srv.port));
  int ep = epoll_create1(0);
  for (int i = 0; i < n; ++i) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = i;
    epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
  }
  std::string arrive =
      Frame(Op::kAdd, {key}, {}, 1) + Frame(Op::kWait, {key + "/go"});
  auto t0 = Clock::now();
  for (int fd : fds) SendAll(fd, arrive);
  std::vector<std::string> in(n);
  int released = 0;
  std::vector<epoll_event> events(256);
  char buf[64];
  while (released < n) {
    int k = epoll_wait(ep, events.data(), events.size(), 30000);
    if (k <= 0) break;
    for (int e = 0; e < k; ++e) {
      int i = events[e].data.u32;
      ssize_t got = recv(fds[i], buf, sizeof(buf), 0);
      if (got <= 0) continue;
      size_t before = in[i].size();
      in[i].append(buf, static_cast<size_t>(got));
      if (before < 8 && in[i].size() >= 8) {
        int64_t count = 0;
        size_t pos = 0;
        GetI64(in[i], &pos, &count);
        if (count == n) SendAll(fds[i], Frame(Op::kSet, {key + "/go"}, {"1"}));
      }
      if (before < 9 && in[i].size() >= 9) ++released;
    }
  }
  double ms =
      std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  for (int fd : fds) close(fd);
  close(ep);
  return released == n ? ms : -1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Options {
  std::string dtstore, torch_host;
  double seconds = 1;
  int rounds = 3, conns = 8, depth = 32;
};

// Runs `measure` on both servers `rounds` times, alternating, and prints
// the medians, their ranges and the ratio (> 1: dtstore better).
void Row(const Options& o, const Server& ours, const Server& theirs,
         const std::string& what, const char* unit, bool higher_better,
         const std::function<double(const Server&, int)>& measure) {
  std::vector<double> a, b;
  for (int r = 0; r < o.rounds; ++r) {
    a.push_back(measure(ours, r));
    b.push_back(measure(theirs, r));
  }
  double ma = Median(a), mb = Median(b);
  double ratio = higher_better ? ma / mb : mb / ma;
  std::printf(
      "| %-34s | %10.1f (%.1f-%.1f) | %10.1f (%.1f-%.1f) | %-5s | %5.2fx |\n",
      what.c_str(), ma, *std::min_element(a.begin(), a.end()),
      *std::max_element(a.begin(), a.end()), mb,
      *std::min_element(b.begin(), b.end()),
      *std::max_element(b.begin(), b.end()), unit, ratio);
  std::fflush(stdout);
}

}  // namespace
}  // namespace dtrun::rendezvous

int main(int argc, char** argv) {
  using namespace dtrun::rendezvous;
  Options o;
  dtrun::testing::Pinning pin;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--dtstore")
      o.dtstore = v;
    else if (a == "--torch-host")
      o.torch_host = v;
    else if (a == "--seconds")
      o.seconds = std::atof(v.c_str());
    else if (a == "--rounds")
      o.rounds = std::atoi(v.c_str());
    else if (a == "--conns")
      o.conns = std::atoi(v.c_str());
    else if (a == "--depth")
      o.depth = std::atoi(v.c_str());
    else if (a == "--dialect")
      g_dialect = v == "2" ? Dialect::kTorch2 : Dialect::kTorch113;
    else if (a == "--pin" && !dtrun::testing::ParsePinning(v, &pin))
      return 2;
  }
  if (o.dtstore.empty() || o.torch_host.empty()) {
    std::fprintf(stderr,
                 "usage: store_load_bench --dtstore PATH --torch-host PATH "
                 "[--seconds S] "
                 "[--rounds R] [--conns C] [--depth D] [--dialect 113|2] "
                 "[--pin CLIENT_CPU,SERVER_CPU]\n");
    return 2;
  }
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  signal(SIGPIPE, SIG_IGN);
  // The servers inherit the CPU this thread is on when they start.
  if (pin.server >= 0 && !dtrun::testing::PinCallerTo(pin.server)) return 2;
  Server ours =
      dtrun::testing::SpawnServer({o.dtstore, "--host", "127.0.0.1", "--port",
                                   "0", "--log-level", "error"});
  Server theirs = dtrun::testing::SpawnServer({o.torch_host});
  if (pin.client >= 0 && !dtrun::testing::PinCallerTo(pin.client)) return 2;
  if (ours.port == 0 || theirs.port == 0) {
    std::fprintf(stderr, "cannot start the servers\n");
    return 1;
  }
  std::string small(16, 'x'), big(1 << 20, 'x');
  for (const Server* s : {&ours, &theirs}) {
    int fd = Connect(s->port);
    SendAll(fd, Frame(Op::kSet, {"/small"}, {small}) +
                    Frame(Op::kSet, {"/big"}, {big}));
    std::string r;
    SendAll(fd, Frame(Op::kGetNumKeys, {}));
    RecvN(fd, 8, &r);
    close(fd);
  }
  std::string c =
      std::to_string(o.conns) + " conns x depth " + std::to_string(o.depth);
  std::printf(
      "| server-bound, raw protocol (%s dialect), %s | dtstore median (range) "
      "| torch server median (range) | unit | ours vs theirs "
      "|\n|---|---:|---:|---|---:|\n",
      g_dialect == Dialect::kTorch2 ? "2.x" : "1.13", c.c_str());
  struct Kind {
    const char* name;
    std::string batch;
    int per_batch, reply;
  };
  std::string sets;
  for (int i = 0; i < 16; ++i)
    sets += Frame(Op::kSet, {"/s" + std::to_string(i)}, {small});
  std::vector<Kind> kinds = {
      {"set", sets + Frame(Op::kGetNumKeys, {}), 16, 8},
      {"get", Frame(Op::kGet, {"/small"}), 1, -1},
      {"add", Frame(Op::kAdd, {"/ctr"}, {}, 1), 1, 8},
      {"get 1 MiB", Frame(Op::kGet, {"/big"}), 1, -1},
  };
  for (const auto& k : kinds) {
    int depth = std::string(k.name) == "get 1 MiB" ? 2 : o.depth;
    std::vector<Throughput> last(2);
    auto run = [&](const Server& s, int) {
      Throughput t = Pipelined(s, o.conns, depth, o.seconds, k.batch,
                               k.per_batch, k.reply);
      last[&s == &ours ? 0 : 1] = t;
      return t.ops_per_s;
    };
    std::vector<double> cpu_a, cpu_b;
    auto run_cpu = [&](const Server& s, int r) {
      double ops = run(s, r);
      (&s == &ours ? cpu_a : cpu_b)
          .push_back(last[&s == &ours ? 0 : 1].cpu_us_per_op);
      return ops;
    };
    Row(o, ours, theirs, std::string(k.name) + ": throughput", "ops/s", true,
        run_cpu);
    Row(o, ours, theirs, std::string(k.name) + ": server CPU/op", "us", false,
        [&](const Server& s, int r) {
          return (&s == &ours ? cpu_a : cpu_b)[r];
        });
  }
  Row(o, ours, theirs, "wait release (median of 200)", "us", false,
      [](const Server& s, int) { return WaitRelease(s, 200); });
  for (int n : {1000, 4000}) {
    Row(o, ours, theirs, "barrier of " + std::to_string(n) + " connections",
        "ms", false, [n](const Server& s, int r) { return Barrier(s, n, r); });
  }
  for (const Server* s : {&ours, &theirs}) {
    kill(s->pid, SIGTERM);
    waitpid(s->pid, nullptr, 0);
  }
  return 0;
}
