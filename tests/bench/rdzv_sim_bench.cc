// Rendezvous at scale without workers: N agents run the real Rendezvous
// code over their own TcpStoreClient connection (one socket each) to a
// real dtstore process on loopback. The agents are fibers on an event loop
// (fiber_loop.h, `--loops` threads, 1 by default): where a client would
// block in the kernel it parks in the loop's epoll, so the simulator costs
// little beside the store. For each N it reports
//   round:     all N call Join at once -> the last one has its assignment
//   requests/bytes through the store for the round (counted at the clients:
//              requests, and c10d wire bytes both ways)
//   steady:    every agent calls Check as dtrun does (every 0.5 s, a
//              heartbeat ADD each keep-alive); the store's CPU (utime+stime
//              of the dtstore process from /proc) as % of one core, and its
//              requests per second
//   per agent: a second table, the round's requests and wire bytes per
//              agent, by operation, as the agents made them in Join
//   detection: one agent stops (its connection closes, as when its host
//              dies); time until a survivor declares it dead, and until the
//              N-1 survivors hold a new round
// The process raises its RLIMIT_NOFILE soft limit to the hard limit (each
// agent holds two sockets, one with --watch 0; dtstore, its child, inherits
// the limit). --smoke: one small run that checks the counts and exits 1
// when a joiner cost more than 4 requests (the suite's test).
//
// With --etcd the store is an etcd cluster started by the caller
// (scripts/bench.sh through tests/bench/etcd_sim_bench.py): each agent has
// its own EtcdStore, the store's CPU is the sum over --etcd-pids, and
// etcd's own counters (writes committed, puts, txns, ranges) come from the
// first member's /metrics.
//
// Usage: rdzv_sim_bench --dtstore PATH [--nodes 64,256,1024,4096]
//                       [--keep-alive-ms 1000] [--attempts 3] [--steady-s 10]
//                       [--watch 1|0]   (0: Check reads the round every call)
//                       [--loops 1] [--smoke 0|1]
//        rdzv_sim_bench --etcd H:P,H:P,H:P --etcd-pids P1,P2,P3 [same flags]
//                       [--leases 1|0]   (0: agents beat in etcd instead;
//                       a lease's own connection per agent puts 4,096
//                       agents past a 20,000-descriptor limit)
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/etcd_store.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/store_client.h"
#include "rendezvous/util/socket_util.h"
#include "tests/bench/fiber_loop.h"
#include "tests/helpers/server_process.h"

namespace dtrun::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::atomic<uint64_t> g_requests{0}, g_bytes{0};
// Requests by operation, for the round's breakdown (stderr).
enum Op {
  kSet,
  kGet,
  kAdd,
  kCas,
  kCheck,
  kWait,
  kDelete,
  kNumKeys,
  kMultiGet,
  kMultiSet,
  kEnlist,
  kOps
};
const char* const kOpNames[kOps] = {
    "set",    "get",     "add",       "cas",       "check", "wait",
    "delete", "numkeys", "multi_get", "multi_set", "enlist"};
// The round's requests and bytes by operation, made in Join.
std::atomic<uint64_t> g_ops[kOps], g_op_bytes[kOps];

// c10d wire size of a request or reply: opcode, u64 lengths, the bytes.
uint64_t Wire(const std::vector<std::string>& strings) {
  uint64_t n = 0;
  for (const auto& s : strings) n += 8 + s.size();
  return n;
}

// Counts the requests and wire bytes an agent sends through the store.
class CountingStore : public Store {
 public:
  // `leases`: false hides the store's leases (agents then beat in it).
  // `joining`: whether its agent is in Join (only those calls are broken
  // down by operation).
  CountingStore(std::unique_ptr<Store> inner, bool leases, const bool* joining,
                bool etcd)
      : inner_(std::move(inner)),
        leases_(leases),
        joining_(joining),
        etcd_(etcd) {}
  Status Set(const std::string& key, std::string_view value) override {
    Count(kSet, 1 + Wire({key, std::string(value)}));
    return inner_->Set(key, value);
  }
  Result<std::string> Get(const std::string& key) override {
    auto r = inner_->Get(key);
    // TcpStoreClient's Get is WAIT then GET.
    Count(kGet, 2 + Wire({key}) * 2 + 1 + 8 + (r.ok() ? r->size() : 0), 2);
    return r;
  }
  Result<int64_t> Add(const std::string& key, int64_t delta) override {
    Count(kAdd, 1 + Wire({key}) + 16);
    return inner_->Add(key, delta);
  }
  Result<std::string> CompareSet(const std::string& key,
                                 std::string_view expected,
                                 std::string_view desired) override {
    auto r = inner_->CompareSet(key, expected, desired);
    Count(kCas, 1 + Wire({key, std::string(expected), std::string(desired)}) +
                    8 + (r.ok() ? r->size() : 0));
    return r;
  }
  Result<bool> Check(const std::vector<std::string>& keys) override {
    Count(kCheck, 1 + 8 + Wire(keys) + 1);
    return inner_->Check(keys);
  }
  Status Wait(const std::vector<std::string>& keys,
              milliseconds timeout) override {
    Count(kWait, 1 + 8 + Wire(keys) + 1);
    return inner_->Wait(keys, timeout);
  }
  Result<bool> DeleteKey(const std::string& key) override {
    Count(kDelete, 1 + Wire({key}) + 8);
    return inner_->DeleteKey(key);
  }
  Result<int64_t> NumKeys() override {
    Count(kNumKeys, 1 + 8);
    return inner_->NumKeys();
  }
  Result<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& keys) override {
    auto r = inner_->MultiGet(keys);
    Count(kMultiGet, 1 + 8 + Wire(keys) + (r.ok() ? Wire(*r) : 0));
    return r;
  }
  Status MultiSet(const std::vector<std::string>& keys,
                  const std::vector<std::string>& values) override {
    Count(kMultiSet, 1 + 8 + Wire(keys) + Wire(values));
    return inner_->MultiSet(keys, values);
  }
  // One COMPARE_SET of dtrun's enlist key (one transaction on etcd).
  Result<Enlisted> Enlist(const Enlistment& e) override {
    Count(kEnlist, 1 +
                       Wire({"dtrun/.enlist", e.counter,
                             e.records + "\n" + e.closes + "\n" + e.record}) +
                       8 + 4);
    return inner_->Enlist(e);
  }
  // c10d: a wait for the records, then one MULTI_GET; etcd: one range.
  Result<std::vector<std::string>> ReadEnlisted(const std::string& records,
                                                int64_t count,
                                                milliseconds wait) override {
    if (!etcd_ && wait.count() > 0)
      Count(kWait, 1 + 8 + 8 + records.size() + 1);
    auto r = inner_->ReadEnlisted(records, count, wait);
    Count(kMultiGet, 1 + 8 + Wire({records}) + (r.ok() ? Wire(*r) : 0));
    return r;
  }
  milliseconds timeout() const override { return inner_->timeout(); }
  // How a node's death is told, as the product's store does it: dtstore
  // counts a bound connection's close, etcd ends a lease.
  Status BindOnClose(const std::string& closes,
                     const std::string& binds) override {
    Status s = inner_->BindOnClose(closes, binds);
    if (s.ok() && !closes.empty()) Count(kSet, 1 + Wire({kOnCloseKey, closes}));
    return s;
  }
  // The put under the lease; its grant and renewals go on a client of the
  // lease's own, counted in etcd's CPU only.
  Status LeaseKey(const std::string& key, milliseconds ttl) override {
    Count(kSet, 1 + Wire({key, "1"}));
    return inner_->LeaseKey(key, ttl);
  }
  void StillAlive() override { inner_->StillAlive(); }
  bool has_leases() const override { return leases_ && inner_->has_leases(); }

 private:
  static constexpr char kOnCloseKey[] = "dtrun/.on_close";
  void Count(Op op, uint64_t bytes, uint64_t requests = 1) {
    if (*joining_) {
      g_ops[op] += requests;
      g_op_bytes[op] += bytes;
    }
    g_requests += requests;
    g_bytes += bytes;
  }
  std::unique_ptr<Store> inner_;
  bool leases_;
  const bool* joining_;
  bool etcd_;
};

using Dtstore = dtrun::testing::ServerProcess;
using dtrun::testing::CpuSeconds;

Dtstore StartDtstore(const std::string& path) {
  return dtrun::testing::SpawnServer(
      {path, "--host", "127.0.0.1", "--port", "0", "--log-level", "error"});
}

void RaiseFdLimit(size_t needed) {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < needed) {
    std::fprintf(stderr,
                 "RLIMIT_NOFILE hard limit %lu < %zu: raise it (ulimit -Hn) "
                 "for this N\n",
                 static_cast<unsigned long>(lim.rlim_max), needed);
  }
}

struct Options {
  std::string dtstore;
  std::string etcd;            // members' endpoints, "h:p,h:p"
  std::vector<int> etcd_pids;  // their processes, for the CPU column
  std::vector<int> nodes = {64, 256, 1024, 4096};
  int keep_alive_ms = 1000, attempts = 3, steady_s = 10;
  bool watch = true;  // Check's push mode (a second connection per agent)
  int loops = 1;      // event-loop threads the agents run on
  bool smoke = false;
  // etcd: each agent's key under a lease of its own (a third connection
  // per agent, as each dtrun has), else heartbeats.
  bool leases = true;
};

// One run's shared clock marks, in seconds since `t0`.
struct Marks {
  Clock::time_point t0;
  std::atomic<int> joined{0}, rejoined{0}, failed{0};
  std::atomic<int64_t> last_join_ns{0}, detect_ns{INT64_MAX}, last_rejoin_ns{0};
  std::atomic<bool> steady{true};
  // Survivors hold their stores (connections, leases) until the round
  // after is measured.
  std::atomic<bool> release{false};
  std::atomic<int> victim_rank{-1};
  Clock::time_point killed;
  std::mutex mu;
  std::string error;

  int64_t Since(Clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() -
                                                                t)
        .count();
  }
  void Max(std::atomic<int64_t>* a, int64_t v) {
    for (int64_t cur = *a; v > cur && !a->compare_exchange_weak(cur, v);) {
    }
  }
  void Min(std::atomic<int64_t>* a, int64_t v) {
    for (int64_t cur = *a; v < cur && !a->compare_exchange_weak(cur, v);) {
    }
  }
  void Fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) error = what;
    ++failed;
  }
};

// One agent, a fiber: join, then Check every 0.5 s as dtrun's launcher
// does; the victim (group rank 1) goes silent when told; survivors rejoin
// once. Its sleeps park it in the loop (sockets::SleepUntil).
void Agent(Store* store, const RendezvousOptions& ro, bool* joining, Marks* m) {
  Rendezvous r(store, ro);
  *joining = true;
  auto a = r.Join(nullptr);
  *joining = false;
  if (!a.ok()) return m->Fail(a.status().message());
  m->Max(&m->last_join_ns, m->Since(m->t0));
  ++m->joined;
  auto tick = std::min(milliseconds(500), ro.keep_alive_interval);
  sockets::SleepUntil(Clock::now() + milliseconds(std::rand() % tick.count()));
  for (;;) {
    if (a->group_rank == m->victim_rank.load())
      return;  // goes silent; socket closes
    auto ev = r.Check(*a);
    if (!ev.ok()) return m->Fail(ev.status().message());
    if (*ev == RoundEvent::kRestart) break;
    if (*ev != RoundEvent::kNone) return m->Fail("unexpected round event");
    sockets::SleepUntil(Clock::now() + tick);
  }
  m->Min(&m->detect_ns, m->Since(m->killed));
  *joining = true;
  auto again = r.Join(nullptr);
  *joining = false;
  if (!again.ok()) return m->Fail(again.status().message());
  m->Max(&m->last_rejoin_ns, m->Since(m->killed));
  ++m->rejoined;
  while (!m->release) sockets::SleepUntil(Clock::now() + milliseconds(20));
}

// An agent's store: a connection to dtstore, or an EtcdStore (and then,
// with --watch 1, its watch in `ro`).
Result<std::unique_ptr<Store>> ConnectStore(const Options& o,
                                            const StoreClientOptions& copts,
                                            RendezvousOptions* ro) {
  if (o.etcd.empty()) {
    auto c = TcpStoreClient::Connect(copts);
    if (!c.ok()) return c.status();
    return std::unique_ptr<Store>(std::move(*c));
  }
  EtcdOptions eo;
  std::stringstream ss(o.etcd);
  for (std::string e; std::getline(ss, e, ',');) eo.endpoints.push_back(e);
  eo.timeout = copts.timeout;
  eo.connect_timeout = std::chrono::seconds(5);
  auto c = EtcdClient::Connect(eo);
  if (!c.ok()) return c.status();
  auto store =
      std::make_unique<EtcdStore>(std::move(*c), "/dtrun-sim/", copts.timeout);
  if (o.watch) {
    ro->open_watch = [s = store.get()] {
      g_requests += 2;  // the two watches of a round
      return Result<std::unique_ptr<KeyWatch>>(s->OpenWatch());
    };
  }
  return std::unique_ptr<Store>(std::move(store));
}

// The store's CPU seconds so far: dtstore's, or every etcd member's.
double StoreCpu(const Options& o, pid_t dtstore) {
  if (o.etcd.empty()) return CpuSeconds(dtstore);
  double sum = 0;
  for (int pid : o.etcd_pids) sum += CpuSeconds(pid);
  return sum;
}

// etcd's own counters, from the first member's /metrics (one HTTP GET on
// a socket of its own): writes committed through raft, and the puts,
// transactions and ranges its key space served. Empty for dtstore.
struct EtcdCounters {
  double proposals = 0, puts = 0, txns = 0, ranges = 0;
};
EtcdCounters ReadEtcdCounters(const Options& o) {
  EtcdCounters c;
  if (o.etcd.empty()) return c;
  const std::string first = o.etcd.substr(0, o.etcd.find(','));
  const size_t colon = first.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port =
      htons(static_cast<uint16_t>(std::atoi(first.c_str() + colon + 1)));
  inet_pton(AF_INET, first.substr(0, colon).c_str(), &a.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (fd >= 0) ::close(fd);
    return c;
  }
  const std::string get = "GET /metrics HTTP/1.0\r\n\r\n";
  (void)!::write(fd, get.data(), get.size());
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, n);
  ::close(fd);
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.rfind(' ');
    if (line.empty() || line[0] == '#' || space == std::string::npos) continue;
    const std::string name = line.substr(0, space);
    const double v = std::atof(line.c_str() + space + 1);
    if (name == "etcd_server_proposals_committed_total") c.proposals = v;
    if (name == "etcd_mvcc_put_total") c.puts = v;
    if (name == "etcd_mvcc_txn_total") c.txns = v;
    if (name == "etcd_mvcc_range_total") c.ranges = v;
  }
  return c;
}

void PrintEtcdCounters(const char* what, int n, const EtcdCounters& a,
                       const EtcdCounters& b) {
  std::fprintf(stderr,
               "N=%d %s, etcd's own counters: %.0f writes committed "
               "(%.2f per agent), %.0f puts, %.0f txns, %.0f ranges\n",
               n, what, b.proposals - a.proposals,
               (b.proposals - a.proposals) / n, b.puts - a.puts,
               b.txns - a.txns, b.ranges - a.ranges);
}

// N agents, each with its own connection (made here, before the loops
// run), spread over the loops; each agent's fiber owns its store.
void SpawnAgents(const Options& o, int n, const Dtstore& d, Marks* m,
                 std::vector<std::unique_ptr<bench::FiberLoop>>* loops) {
  // etcd keeps what a run wrote: each run has an id of its own there.
  static int runs = 0;
  const std::string run_id =
      o.etcd.empty()
          ? "sim"
          : "sim-" + std::to_string(getpid()) + "-" + std::to_string(++runs);
  for (int i = 0; i < n; ++i) {
    StoreClientOptions copts;
    copts.port = d.port;
    copts.timeout = std::chrono::seconds(60);
    RendezvousOptions ro;
    auto client = ConnectStore(o, copts, &ro);
    if (!client.ok()) {
      std::fprintf(stderr, "connect %d: %s\n", i,
                   client.status().message().c_str());
      if (d.pid > 0) {
        kill(d.pid, SIGTERM);
        waitpid(d.pid, nullptr, 0);
      }
      std::exit(1);
    }
    ro.run_id = run_id;
    ro.node_id = "node" + std::to_string(i);
    ro.min_nodes = n - 1;  // the survivors may go on without the dead node
    ro.max_nodes = n;
    ro.last_call_timeout = milliseconds(500);
    ro.keep_alive_interval = milliseconds(o.keep_alive_ms);
    ro.keep_alive_max_attempt = o.attempts;
    ro.join_timeout = std::chrono::seconds(120);
    if (o.watch && o.etcd.empty()) {
      StoreClientOptions wopts = copts;
      wopts.dialect = Dialect::kTorch113;
      ro.open_watch = [wopts] {
        // Its WATCH_KEY registrations (two a round) count as requests; what
        // the store pushes shows in its CPU.
        g_requests += 2;
        return ConnectWatch(wopts);
      };
    }
    auto joining = std::make_shared<bool>(false);
    std::shared_ptr<Store> store = std::make_shared<CountingStore>(
        std::move(*client), o.leases, joining.get(), !o.etcd.empty());
    (*loops)[i % loops->size()]->Spawn(
        [store, ro, joining, m] { Agent(store.get(), ro, joining.get(), m); });
  }
}

// The round's store calls per agent by operation, on stderr.
// Returns the requests per agent in all.
double PrintBreakdown(int n, const uint64_t* before,
                      const uint64_t* bytes_before) {
  std::string line, bytes;
  uint64_t all = 0;
  for (int i = 0; i < kOps; ++i) {
    const uint64_t calls = g_ops[i] - before[i];
    if (calls == 0) continue;
    all += calls;
    char cell[96];
    std::snprintf(cell, sizeof cell, " %s %.2f", kOpNames[i],
                  static_cast<double>(calls) / n);
    line += cell;
    std::snprintf(cell, sizeof cell, " %s %.0f", kOpNames[i],
                  static_cast<double>(g_op_bytes[i] - bytes_before[i]) / n);
    bytes += cell;
  }
  std::fprintf(stderr,
               "N=%d round, per agent in Join: requests %.2f:%s; wire "
               "bytes:%s\n",
               n, static_cast<double>(all) / n, line.c_str(), bytes.c_str());
  return static_cast<double>(all) / n;
}

int RunOne(const Options& o, int n) {
  Dtstore d;
  if (o.etcd.empty()) d = StartDtstore(o.dtstore);
  if (o.etcd.empty() && (d.pid < 0 || d.port == 0)) {
    std::fprintf(stderr, "cannot start %s\n", o.dtstore.c_str());
    return 1;
  }
  Marks m;
  std::vector<std::unique_ptr<bench::FiberLoop>> loops;
  for (int i = 0; i < std::max(1, o.loops); ++i)
    loops.push_back(std::make_unique<bench::FiberLoop>());
  SpawnAgents(o, n, d, &m, &loops);
  double cpu0 = StoreCpu(o, d.pid);
  const double sim0 = CpuSeconds(getpid());
  const EtcdCounters etcd0 = ReadEtcdCounters(o);
  uint64_t req0 = g_requests, bytes0 = g_bytes;
  uint64_t ops0[kOps], opbytes0[kOps];
  for (int i = 0; i < kOps; ++i) {
    ops0[i] = g_ops[i];
    opbytes0[i] = g_op_bytes[i];
  }
  m.t0 = Clock::now();
  std::vector<std::thread> agents;
  for (auto& loop : loops) agents.emplace_back([l = loop.get()] { l->Run(); });
  while (m.joined < n && m.failed == 0)
    std::this_thread::sleep_for(milliseconds(5));
  double round_s = m.last_join_ns / 1e9;
  double round_cpu = StoreCpu(o, d.pid) - cpu0;
  uint64_t round_req = g_requests - req0, round_bytes = g_bytes - bytes0;
  const double per_agent = PrintBreakdown(n, ops0, opbytes0);
  std::fprintf(stderr,
               "N=%d round: the simulator's own CPU %.2f s, the store's %.2f "
               "s\n",
               n, CpuSeconds(getpid()) - sim0, round_cpu);
  if (!o.etcd.empty())
    PrintEtcdCounters("round", n, etcd0, ReadEtcdCounters(o));
  for (int i = 0; i < kOps; ++i) {
    ops0[i] = g_ops[i];
    opbytes0[i] = g_op_bytes[i];
  }
  // Steady state: let the agents settle into their Check rhythm, then measure.
  std::this_thread::sleep_for(milliseconds(1000));
  double cpu1 = StoreCpu(o, d.pid);
  const EtcdCounters etcd_steady = ReadEtcdCounters(o);
  uint64_t req1 = g_requests, bytes1 = g_bytes;
  std::this_thread::sleep_for(std::chrono::seconds(o.steady_s));
  double steady_cpu = (StoreCpu(o, d.pid) - cpu1) / o.steady_s;
  double steady_rps = static_cast<double>(g_requests - req1) / o.steady_s;
  double steady_bps = static_cast<double>(g_bytes - bytes1) / o.steady_s;
  const EtcdCounters etcd1 = ReadEtcdCounters(o);
  if (!o.etcd.empty()) PrintEtcdCounters("steady", n, etcd_steady, etcd1);
  m.killed = Clock::now();
  m.victim_rank = 1;
  while (m.rejoined < n - 1 && m.failed == 0 &&
         Clock::now() - m.killed < std::chrono::seconds(120)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  const EtcdCounters etcd2 = ReadEtcdCounters(o);
  m.release = true;
  for (auto& t : agents) t.join();
  std::fprintf(stderr, "N=%d: the survivors' round; ", n);
  const double rejoin_per_agent = PrintBreakdown(n - 1, ops0, opbytes0);
  if (!o.etcd.empty())
    PrintEtcdCounters("the survivors' round", n - 1, etcd1, etcd2);
  if (d.pid > 0) {
    kill(d.pid, SIGTERM);
    waitpid(d.pid, nullptr, 0);
  }
  if (m.failed > 0) {
    std::fprintf(stderr, "N=%d: %d agent(s) failed: %s\n", n, m.failed.load(),
                 m.error.c_str());
    return 1;
  }
  // Four per joiner, and the closer's few (the count, its claim, the
  // records, the ranks, `final`, the other jobs' list when the round
  // closes short) and the last call's, spread over the round.
  const double budget = 4.0 + 10.0 / (n - 1);
  if (o.smoke && (per_agent > budget || rejoin_per_agent > budget)) {
    std::fprintf(stderr,
                 "N=%d: a joiner cost %.2f requests (%.2f in the survivors' "
                 "round); at most %.2f expected\n",
                 n, per_agent, rejoin_per_agent, budget);
    return 1;
  }
  std::printf(
      "| %d | %.2f s | %lu | %.1f KiB | %.2f s | %.0f /s | %.1f KiB/s | %.1f "
      "%% | "
      "%.2f s | %.2f s |\n",
      n, round_s, static_cast<unsigned long>(round_req), round_bytes / 1024.0,
      round_cpu, steady_rps, steady_bps / 1024.0, steady_cpu * 100,
      m.detect_ns / 1e9, m.last_rejoin_ns / 1e9);
  std::fflush(stdout);
  return 0;
}

std::vector<int> ParseList(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');)
    out.push_back(std::atoi(item.c_str()));
  return out;
}

}  // namespace
}  // namespace dtrun::rendezvous

int main(int argc, char** argv) {
  using namespace dtrun::rendezvous;
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dtstore")
      o.dtstore = value;
    else if (flag == "--nodes")
      o.nodes = ParseList(value);
    else if (flag == "--keep-alive-ms")
      o.keep_alive_ms = std::atoi(value.c_str());
    else if (flag == "--attempts")
      o.attempts = std::atoi(value.c_str());
    else if (flag == "--steady-s")
      o.steady_s = std::atoi(value.c_str());
    else if (flag == "--etcd")
      o.etcd = value;
    else if (flag == "--etcd-pids")
      o.etcd_pids = ParseList(value);
    else if (flag == "--watch")
      o.watch = value != "0";
    else if (flag == "--leases")
      o.leases = value != "0";
    else if (flag == "--loops")
      o.loops = std::max(1, std::atoi(value.c_str()));
    else if (flag == "--smoke")
      o.smoke = value != "0";
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (o.dtstore.empty() && o.etcd.empty()) {
    std::fprintf(
        stderr,
        "usage: rdzv_sim_bench --dtstore PATH [--nodes 64,256,1024,4096] "
        "[--keep-alive-ms 1000] [--attempts 3] [--steady-s 10] "
        "[--watch 1|0] [--loops N] [--smoke 0|1]\n       rdzv_sim_bench "
        "--etcd H:P,... --etcd-pids "
        "P,... [same flags] [--leases 1|0]\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  RaiseFdLimit(
      static_cast<size_t>(*std::max_element(o.nodes.begin(), o.nodes.end())) *
          ((o.watch ? 2 : 1) + (!o.etcd.empty() && o.leases ? 2 : 0)) +
      64);
  std::printf(
      "| agents | round | requests | wire bytes | store CPU (round) | steady "
      "requests "
      "| steady bytes | store CPU (steady, %% of a core) | dead node detected "
      "after "
      "| survivors' new round after "
      "|\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int n : o.nodes) {
    if (RunOne(o, n) != 0) return 1;
  }
  std::printf(
      "(keep-alive %d ms x %d attempts; Check every %d ms, %s; last call 0.5 s "
      "for the survivors' round)\n",
      o.keep_alive_ms, o.attempts, std::min(500, o.keep_alive_ms),
      o.watch ? (o.etcd.empty() ? "changes pushed on a watch connection"
                                : "changes pushed on etcd watches")
              : "reading every time");
  return 0;
}
