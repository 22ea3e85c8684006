// Our store server (dtstore) against libtorch's TCPStore server, in one run,
// with libtorch's own C++ c10d::TCPStore client driving both. Each server
// runs in its own process. Prints a Markdown table with the ratio ours/theirs.
// Built against libtorch 1.13 it drives a 1.13 server (torch_store_host); built
// in the torch 2.6 root (scripts/torch2.sh) it drives a 2.6 one: the two
// dialects differ, so one client cannot drive both servers.
//
// Usage: store_bench --dtstore PATH --torch-host PATH [--seconds S]
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include "rendezvous/wire.h"
#include "tests/helpers/server_process.h"
#include "tests/helpers/wire_frame.h"

namespace {

using Clock = std::chrono::steady_clock;
using dtrun::rendezvous::Dialect;
using dtrun::rendezvous::Op;
using dtrun::rendezvous::Request;

// The raw barrier connections speak the dialect of the libtorch built against.
constexpr Dialect kDialect =
    TORCH_VERSION_MAJOR >= 2 ? Dialect::kTorch2 : Dialect::kTorch113;

// A server child process; stopped with SIGTERM by pid.
struct ServerProc {
  pid_t pid = -1;
  uint16_t port = 0;
  ~ServerProc() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
};

std::unique_ptr<ServerProc> Spawn(const std::vector<std::string>& argv) {
  dtrun::testing::ServerProcess started = dtrun::testing::SpawnServer(argv);
  auto proc = std::make_unique<ServerProc>();
  proc->pid = started.pid;  // stopped by ~ServerProc, started or not
  if (started.port == 0) {
    std::fprintf(stderr, "server %s did not start\n", argv[0].c_str());
    return nullptr;
  }
  proc->port = started.port;
  return proc;
}

std::unique_ptr<c10d::TCPStore> Connect(uint16_t port) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = false;
  opts.timeout = std::chrono::seconds(60);
#if TORCH_VERSION_MAJOR >= 2
  opts.useLibUV = false;  // Debian's 2.x is built without libuv
#endif
  return std::make_unique<c10d::TCPStore>("127.0.0.1", opts);
}

struct OpStats {
  double ops_per_s = 0, p50_us = 0, p99_us = 0;
  double server_cpu_us_per_op = 0;  // user + system time of the server process
};

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1)));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

OpStats RunOps(const ServerProc& server, int clients, const std::string& op,
               size_t value_bytes, double seconds) {
  std::vector<std::unique_ptr<c10d::TCPStore>> stores;
  for (int i = 0; i < clients; ++i) stores.push_back(Connect(server.port));
  std::vector<uint8_t> value(value_bytes, 'x');
  for (int i = 0; i < clients; ++i)
    stores[i]->set("k" + std::to_string(i), value);
  std::vector<std::vector<double>> lat(clients);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  auto end = Clock::now() + std::chrono::milliseconds(200) +
             std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      std::string key = "k" + std::to_string(i);
      lat[i].reserve(1 << 20);
      while (!go) std::this_thread::yield();
      while (Clock::now() < end) {
        auto t0 = Clock::now();
        if (op == "set")
          stores[i]->set(key, value);
        else if (op == "get")
          stores[i]->get(key);
        else
          stores[i]->add("counter", 1);
        lat[i].push_back(
            std::chrono::duration<double, std::micro>(Clock::now() - t0)
                .count());
      }
    });
  }
  auto start = Clock::now();
  double cpu_start = dtrun::testing::CpuSeconds(server.pid);
  go = true;
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  double cpu = dtrun::testing::CpuSeconds(server.pid) - cpu_start;
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  OpStats s;
  s.ops_per_s = all.size() / elapsed;
  s.p50_us = Percentile(all, 0.50);
  s.p99_us = Percentile(all, 0.99);
  s.server_cpu_us_per_op = all.empty() ? 0 : cpu * 1e6 / all.size();
  return s;
}

// Median microseconds from one client's set() to another's wait() return.
double WaitRelease(uint16_t port, int iterations) {
  auto waiter = Connect(port);
  auto setter = Connect(port);
  std::vector<double> lat;
  for (int i = 0; i < iterations; ++i) {
    std::string key = "release" + std::to_string(i);
    std::atomic<int64_t> set_at{0};
    std::thread t([&] {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(2));  // wait registers
      set_at = Clock::now().time_since_epoch().count();
      setter->set(key, {1});
    });
    waiter->wait({key});
    auto done = Clock::now().time_since_epoch().count();
    t.join();
    lat.push_back((done - set_at.load()) / 1000.0);
  }
  return Percentile(lat, 0.5);
}

std::string Frame(Op op, std::vector<std::string> keys,
                  std::vector<std::string> values, int64_t number) {
  return dtrun::testing::EncodeFrame(kDialect, op, std::move(keys),
                                     std::move(values), number);
}

// N raw connections each ADD a counter and WAIT for a key the last arrival
// sets. Seconds from the first connect to the last release; -1 on failure.
double Barrier(uint16_t port, int n) {
  struct Conn {
    int fd;
    std::string in;
    bool sent = false, done = false;
  };
  int ep = epoll_create1(0);
  std::vector<Conn> conns(n);
  std::string key = "/barrier" + std::to_string(n) + "_" + std::to_string(port);
  std::string arrive =
      Frame(Op::kAdd, {key}, {}, 1) + Frame(Op::kWait, {key + "/done"}, {}, 0);
  if (kDialect == Dialect::kTorch2) {
    // A 2.x server drops a connection whose first message is not VALIDATE
    // (it has no reply).
    Request validate;
    validate.op = Op::kValidate;
    validate.word = dtrun::rendezvous::kValidateMagic;
    std::string first;
    EncodeRequest(validate, kDialect, &first);
    arrive = first + arrive;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    conns[i].fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(conns[i].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    connect(conns[i].fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLIN;
    ev.data.u32 = i;
    epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &ev);
  }
  int released = 0, failed = 0;
  std::vector<epoll_event> events(1024);
  while (released + failed < n) {
    int k = epoll_wait(ep, events.data(), events.size(), 30000);
    if (k <= 0) break;
    for (int e = 0; e < k; ++e) {
      Conn& c = conns[events[e].data.u32];
      if (c.done) continue;
      if (events[e].events & (EPOLLERR | EPOLLHUP)) {
        c.done = true;
        ++failed;
        continue;
      }
      if (!c.sent && (events[e].events & EPOLLOUT)) {
        send(c.fd, arrive.data(), arrive.size(), MSG_NOSIGNAL);
        c.sent = true;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u32 = events[e].data.u32;
        epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev);
      }
      char buf[64];
      ssize_t got;
      while ((got = recv(c.fd, buf, sizeof(buf), 0)) > 0) c.in.append(buf, got);
      if (c.in.size() >= 8 && c.in.size() < 9 + 8) {
        int64_t count;
        std::memcpy(&count, c.in.data(), 8);
        if (count == n && c.in.size() == 8) {
          std::string done = Frame(Op::kSet, {key + "/done"}, {"1"}, 0);
          send(c.fd, done.data(), done.size(), MSG_NOSIGNAL);
          c.in += '!';  // mark: SET sent
        }
      }
      size_t want = 9 + (c.in.size() > 8 && c.in[8] == '!' ? 1 : 0);
      if (c.in.size() >= want) {
        c.done = true;
        ++released;
      }
    }
  }
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& c : conns) close(c.fd);
  close(ep);
  return released == n ? secs : -1;
}

std::string g_filter;  // run only the rows whose name contains this
bool Want(const std::string& what) {
  return what.find(g_filter) != std::string::npos;
}

void Row(const char* what, double ours, double theirs, const char* unit,
         bool higher_better) {
  double ratio = higher_better ? ours / theirs : theirs / ours;
  std::printf("| %-34s | %12.1f | %12.1f | %-6s | %5.2fx |\n", what, ours,
              theirs, unit, ratio);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtstore, torch_host;
  double seconds = 1.0;
  dtrun::testing::Pinning pin;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--dtstore")
      dtstore = argv[i + 1];
    else if (a == "--torch-host")
      torch_host = argv[i + 1];
    else if (a == "--seconds")
      seconds = std::atof(argv[i + 1]);
    else if (a == "--filter")
      g_filter = argv[i + 1];
    else if (a == "--pin" && !dtrun::testing::ParsePinning(argv[i + 1], &pin))
      return 2;
  }
  if (dtstore.empty() || torch_host.empty()) {
    std::fprintf(
        stderr,
        "usage: store_bench --dtstore PATH --torch-host PATH [--seconds S] "
        "[--filter ROW] [--pin CLIENT_CPU,SERVER_CPU]\n");
    return 2;
  }
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  signal(SIGPIPE, SIG_IGN);
  // The servers inherit the CPU this thread is on when they start, and the
  // client threads the one it is on when they do.
  if (pin.server >= 0 && !dtrun::testing::PinCallerTo(pin.server)) return 2;
  auto ours = Spawn(
      {dtstore, "--host", "127.0.0.1", "--port", "0", "--log-level", "error"});
  auto theirs = Spawn({torch_host});
  if (pin.client >= 0 && !dtrun::testing::PinCallerTo(pin.client)) return 2;
  if (!ours || !theirs) return 1;

  std::printf(
      "| measurement (libtorch %d.%d C++ client) | dtstore | torch %d.%d "
      "server | unit "
      "| ours vs theirs |\n",
      TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_MAJOR,
      TORCH_VERSION_MINOR);
  std::printf("|---|---:|---:|---|---:|\n");
  for (const char* op : {"set", "get", "add"}) {
    for (int clients : {1, 8, 32}) {
      if (!Want(std::string(op) + ", " + std::to_string(clients) + " clients"))
        continue;
      OpStats a = RunOps(*ours, clients, op, 16, seconds);
      OpStats b = RunOps(*theirs, clients, op, 16, seconds);
      char what[64];
      std::snprintf(what, sizeof(what), "%s, %d clients: throughput", op,
                    clients);
      Row(what, a.ops_per_s, b.ops_per_s, "ops/s", true);
      std::snprintf(what, sizeof(what), "%s, %d clients: p50", op, clients);
      Row(what, a.p50_us, b.p50_us, "us", false);
      std::snprintf(what, sizeof(what), "%s, %d clients: p99", op, clients);
      Row(what, a.p99_us, b.p99_us, "us", false);
      std::snprintf(what, sizeof(what), "%s, %d clients: server CPU/op", op,
                    clients);
      Row(what, a.server_cpu_us_per_op, b.server_cpu_us_per_op, "us", false);
    }
  }
  for (int clients : {1, 8}) {
    if (!Want("get 1 MiB, " + std::to_string(clients) + " clients")) continue;
    OpStats a = RunOps(*ours, clients, "get", 1 << 20, seconds);
    OpStats b = RunOps(*theirs, clients, "get", 1 << 20, seconds);
    char what[64];
    std::snprintf(what, sizeof(what), "get 1 MiB, %d clients: throughput",
                  clients);
    Row(what, a.ops_per_s, b.ops_per_s, "ops/s", true);
    std::snprintf(what, sizeof(what), "get 1 MiB, %d clients: server CPU/op",
                  clients);
    Row(what, a.server_cpu_us_per_op, b.server_cpu_us_per_op, "us", false);
  }
  if (Want("wait release"))
    Row("wait release (median)", WaitRelease(ours->port, 200),
        WaitRelease(theirs->port, 200), "us", false);
  for (int n : {1000, 4000}) {
    char what[64];
    std::snprintf(what, sizeof(what), "barrier of %d connections", n);
    if (!Want(what)) continue;
    double a = Barrier(ours->port, n);
    double b = Barrier(theirs->port, n);
    Row(what, a * 1000, b * 1000, "ms", false);
  }
  return 0;
}
