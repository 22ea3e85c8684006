// Rendezvous rounds over a real store server: many agents with a connection
// each (MULTI_GET and MULTI_SET on the wire), and the watch connection on
// which the store pushes a round's changes. Time is a FakeClock here too;
// where a push must have arrived before the next check, the test waits for
// it on the watch connection (AwaitChange) instead of sleeping.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <set>

#include "rendezvous/rendezvous.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/rendezvous_nodes.h"

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;
using testing::FakeClock;

// Shared with the other rounds' tests (tests/testing/rendezvous_nodes.h).
RendezvousOptions Options(const std::string& id, int min_nodes, int max_nodes) {
  return testing::NodeOptions(id, min_nodes, max_nodes);
}
using testing::JoinAsync;

// Many agents, each with its own connection to a real server (MULTI_GET and
// MULTI_SET on the wire): distinct ranks, one ring of watched nodes, and a
// second round that keeps every node's rank.
TEST(RendezvousTest, ManyNodesOverTcpGetDistinctRanksInARing) {
  constexpr int kNodes = 48;
  auto server = StoreServer::Start(StoreServerOptions{});
  ASSERT_TRUE(server.ok());
  (*server)->RunInBackground();
  std::vector<std::unique_ptr<TcpStoreClient>> clients;
  std::vector<std::unique_ptr<Rendezvous>> nodes;
  for (int i = 0; i < kNodes; ++i) {
    StoreClientOptions copts;
    copts.port = (*server)->port();
    auto c = TcpStoreClient::Connect(copts);
    ASSERT_TRUE(c.ok()) << c.status().message();
    clients.push_back(std::move(*c));
    auto o = Options("n" + std::to_string(i), kNodes, kNodes);
    o.join_timeout = milliseconds(20000);
    nodes.push_back(std::make_unique<Rendezvous>(clients.back().get(), o));
  }
  auto join_all = [&] {
    std::vector<std::future<Result<Assignment>>> futures;
    for (auto& n : nodes) futures.push_back(JoinAsync(n.get()));
    std::vector<Assignment> out;
    for (auto& f : futures) {
      auto r = f.get();
      EXPECT_TRUE(r.ok()) << r.status().message();
      out.push_back(r.ok() ? *r : Assignment{});
    }
    return out;
  };
  auto first = join_all();
  std::set<int> ranks;
  std::map<int, std::string> id_of_rank, next_of_rank;
  for (int i = 0; i < kNodes; ++i) {
    EXPECT_EQ(first[i].group_world_size, kNodes);
    EXPECT_EQ(first[i].world_size, 2 * kNodes);
    ranks.insert(first[i].group_rank);
    id_of_rank[first[i].group_rank] = "n" + std::to_string(i);
    next_of_rank[first[i].group_rank] = first[i].next_node;
  }
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kNodes));
  for (int g = 0; g < kNodes; ++g)
    EXPECT_EQ(next_of_rank[g], id_of_rank[(g + 1) % kNodes]);
  ASSERT_EQ(*nodes[0]->ReportFailure(first[0], "exit 1"), 1);
  for (int i = 1; i < kNodes; ++i)
    EXPECT_EQ(*nodes[i]->Check(first[i]), RoundEvent::kRestart);
  auto second = join_all();
  for (int i = 0; i < kNodes; ++i) {
    EXPECT_EQ(second[i].round, 1);
    EXPECT_EQ(second[i].failures, 1);
    EXPECT_EQ(second[i].group_rank, first[i].group_rank);  // ranks are stable
  }
}

// Counts what a node asks of the store, by kind.
class CountingStore : public Store {
 public:
  explicit CountingStore(Store* inner) : inner_(inner) {}
  Status Set(const std::string& k, std::string_view v) override {
    ++other;
    return inner_->Set(k, v);
  }
  Result<std::string> Get(const std::string& k) override {
    ++other;
    return inner_->Get(k);
  }
  Result<int64_t> Add(const std::string& k, int64_t d) override {
    ++adds;
    return inner_->Add(k, d);
  }
  Result<std::string> CompareSet(const std::string& k, std::string_view e,
                                 std::string_view d) override {
    ++other;
    return inner_->CompareSet(k, e, d);
  }
  Result<bool> Check(const std::vector<std::string>& k) override {
    ++other;
    return inner_->Check(k);
  }
  Status Wait(const std::vector<std::string>& k,
              std::chrono::milliseconds t) override {
    ++other;
    return inner_->Wait(k, t);
  }
  Result<bool> DeleteKey(const std::string& k) override {
    ++other;
    return inner_->DeleteKey(k);
  }
  Result<int64_t> NumKeys() override { return inner_->NumKeys(); }
  Result<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& k) override {
    ++reads;
    return inner_->MultiGet(k);
  }
  Status MultiSet(const std::vector<std::string>& k,
                  const std::vector<std::string>& v) override {
    ++other;
    return inner_->MultiSet(k, v);
  }
  std::chrono::milliseconds timeout() const override {
    return inner_->timeout();
  }
  std::atomic<int> adds{0}, reads{0}, other{0};

 private:
  Store* inner_;
};

// Two nodes over a real server on one FakeClock, each with a watch
// connection when `watch` (kept in watches[] for the test to wait on).
struct PushedPair {
  explicit PushedPair(bool watch, milliseconds keep_alive) {
    auto s = StoreServer::Start(StoreServerOptions{});
    EXPECT_TRUE(s.ok());
    server = std::move(*s);
    server->RunInBackground();
    for (int i = 0; i < 2; ++i) {
      StoreClientOptions copts;
      copts.port = server->port();
      auto c = TcpStoreClient::Connect(copts);
      EXPECT_TRUE(c.ok()) << c.status().message();
      clients[i] = std::move(*c);
      counted[i] = std::make_unique<CountingStore>(clients[i].get());
      auto o = Options(i == 0 ? "a" : "b", 1, 2);
      o.keep_alive_interval = keep_alive;
      if (watch) {
        copts.dialect = Dialect::kTorch113;
        TcpStoreClient** seen = &watches[i];
        o.open_watch = [copts, seen]() -> Result<std::unique_ptr<KeyWatch>> {
          auto c = TcpStoreClient::Connect(copts);
          if (!c.ok()) return c.status();
          *seen = c->get();
          return std::unique_ptr<KeyWatch>(std::move(*c));
        };
      }
      nodes[i] = std::make_unique<Rendezvous>(counted[i].get(), o, clock);
    }
    auto fb = JoinAsync(nodes[1].get());
    auto ra = nodes[0]->Join(nullptr);
    EXPECT_TRUE(ra.ok());
    auto rb = fb.get();
    EXPECT_TRUE(rb.ok());
    a = *ra;
    b = *rb;
  }
  // The heartbeat counter of `rank` as the store holds it.
  std::string Beats(int rank) {
    auto v = clients[0]->Get("rdzv/job/round/0/hb/" + std::to_string(rank));
    return v.ok() ? *v : "";
  }
  // Blocks until node i's watch connection has a change waiting.
  void AwaitPush(int i) {
    ASSERT_NE(watches[i], nullptr);
    auto got = watches[i]->AwaitChange(milliseconds(5000));
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_TRUE(*got) << "no push within 5 s";
  }
  FakeClock clock;
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<TcpStoreClient> clients[2];
  TcpStoreClient* watches[2] = {nullptr, nullptr};
  std::unique_ptr<CountingStore> counted[2];
  std::unique_ptr<Rendezvous> nodes[2];
  Assignment a, b;
};

// With the watch, a standing round costs each node its heartbeat ADDs only;
// a new round reaches the other node through the store's push.
TEST(RendezvousPushTest, AStandingRoundIsNotReadAndANewOneIsPushed) {
  PushedPair p(true, milliseconds(500));
  ASSERT_EQ(*p.nodes[0]->Check(p.a), RoundEvent::kNone);
  ASSERT_EQ(*p.nodes[1]->Check(p.b), RoundEvent::kNone);
  EXPECT_TRUE(p.nodes[0]->pushed(p.a));
  int reads = p.counted[0]->reads, other = p.counted[0]->other;
  int reads_b = p.counted[1]->reads;
  for (int i = 0; i < 20; ++i) {  // 200 ms: neither reads
    p.clock.Advance(milliseconds(10));
    ASSERT_EQ(*p.nodes[0]->Check(p.a), RoundEvent::kNone);
    ASSERT_EQ(*p.nodes[1]->Check(p.b), RoundEvent::kNone);
  }
  EXPECT_EQ(p.counted[0]->reads, reads);
  EXPECT_EQ(p.counted[1]->reads, reads_b);
  EXPECT_EQ(p.counted[0]->other, other);
  // Group rank 0 still reads its two counters (ADD 0) on every check.
  EXPECT_GE(p.counted[0]->adds + p.counted[1]->adds, 40);
  ASSERT_EQ(*p.nodes[1]->ReportFailure(p.b, "exit 1"), 1);
  // The push is noticed with no read.
  p.AwaitPush(0);
  auto ev = p.nodes[0]->Check(p.a);
  ASSERT_TRUE(ev.ok()) << ev.status().message();
  EXPECT_EQ(*ev, RoundEvent::kRestart);
  EXPECT_EQ(p.counted[0]->reads, reads + 1);  // read once, after the push
}

// The watched node's heartbeats arrive as pushes; when they stop, the node
// is declared dead after keep-alive x attempts, as when reading.
TEST(RendezvousPushTest, ASilentNodeIsDeclaredDeadFromPushes) {
  PushedPair p(true, milliseconds(50));
  // Both check every 5 ms for 300 ms (b's beats keep a's view of it alive),
  // then b goes silent. A beat of b reaches a as a push before a checks
  // again, as it would in the time a real check interval leaves.
  const int a_rank = p.a.group_rank, b_rank = p.b.group_rank;
  ASSERT_EQ(*p.nodes[0]->Check(p.a), RoundEvent::kNone);
  std::string a_beats = p.Beats(a_rank);
  for (int i = 0; i < 60; ++i) {
    p.clock.Advance(milliseconds(5));
    if (p.Beats(a_rank) != a_beats) p.AwaitPush(1);
    std::string before = p.Beats(b_rank);
    ASSERT_EQ(*p.nodes[1]->Check(p.b), RoundEvent::kNone) << "at step " << i;
    if (p.Beats(b_rank) != before) p.AwaitPush(0);
    a_beats = p.Beats(a_rank);
    ASSERT_EQ(*p.nodes[0]->Check(p.a), RoundEvent::kNone) << "at step " << i;
  }
  EXPECT_TRUE(p.nodes[0]->pushed(p.a));
  const auto silent = p.clock.Elapsed();
  Result<RoundEvent> ev = RoundEvent::kNone;
  for (int i = 0; i < 100 && ev.ok() && *ev == RoundEvent::kNone; ++i) {
    p.clock.Advance(milliseconds(5));
    ev = p.nodes[0]->Check(p.a);
  }
  ASSERT_TRUE(ev.ok()) << ev.status().message();
  EXPECT_EQ(*ev, RoundEvent::kRestart);
  auto took = p.clock.Elapsed() - silent;
  EXPECT_GE(took, milliseconds(100));  // 150 ms less b's last beat's age
  EXPECT_LE(took, milliseconds(155));
}

// A store that cannot watch (here: a watch connection in the torch 2
// dialect, which has no WATCH_KEY) leaves Check reading, as without one.
TEST(RendezvousPushTest, NoWatchMeansReadingEveryCheck) {
  PushedPair p(false, milliseconds(100));
  ASSERT_EQ(*p.nodes[0]->Check(p.a), RoundEvent::kNone);
  EXPECT_FALSE(p.nodes[0]->pushed(p.a));
  auto o = Options("c", 1, 2);
  StoreClientOptions copts;
  copts.port = p.server->port();  // torch 2 dialect: WatchKey refuses
  o.open_watch = [copts] { return ConnectWatch(copts); };
  Rendezvous c(p.counted[0].get(), o);
  int reads = p.counted[0]->reads;
  ASSERT_EQ(*c.Check(p.a), RoundEvent::kNone);
  ASSERT_EQ(*c.Check(p.a), RoundEvent::kNone);
  EXPECT_FALSE(c.pushed(p.a));
  EXPECT_EQ(p.counted[0]->reads, reads + 2);
  o.open_watch = [] {
    return Result<std::unique_ptr<KeyWatch>>(
        Status::Unavailable("no store here"));
  };
  Rendezvous d(p.counted[0].get(), o);
  ASSERT_EQ(*d.Check(p.a), RoundEvent::kNone);
  EXPECT_EQ(p.counted[0]->reads, reads + 3);
}

}  // namespace
}  // namespace dtrun::rendezvous
