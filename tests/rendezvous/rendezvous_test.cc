// Rendezvous rounds of several agents, one thread each, over one in-process
// MemoryStore (as gloo's tests run ranks over a HashStore).
#include "rendezvous/rendezvous.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "rendezvous/memory_store.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;

RendezvousOptions Options(const std::string& id, int min_nodes, int max_nodes) {
  RendezvousOptions o;
  o.run_id = "job";
  o.node_id = id;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.nproc_per_node = 2;
  o.max_restarts = 1;
  o.join_timeout = milliseconds(2000);
  o.last_call_timeout = milliseconds(100);
  o.keep_alive_interval = milliseconds(20);
  o.keep_alive_max_attempt = 3;
  o.poll_interval = milliseconds(5);
  return o;
}

std::future<Result<Assignment>> JoinAsync(Rendezvous* r) {
  return std::async(std::launch::async, [r] { return r->Join(nullptr); });
}

TEST(RendezvousTest, StaticRanksFollowNodeRank) {
  MemoryStore store;
  auto oa = Options("a", 2, 2), ob = Options("b", 2, 2);
  oa.node_rank = 1;
  ob.node_rank = 0;
  Rendezvous a(&store, oa), b(&store, ob);
  auto fa = JoinAsync(&a);
  auto rb = b.Join(nullptr);
  auto ra = fa.get();
  ASSERT_TRUE(ra.ok()) << ra.status().message();
  ASSERT_TRUE(rb.ok()) << rb.status().message();
  EXPECT_EQ(ra->group_rank, 1);
  EXPECT_EQ(rb->group_rank, 0);
  EXPECT_EQ(ra->base_rank, 2);
  EXPECT_EQ(ra->world_size, 4);
  EXPECT_EQ(ra->group_world_size, 2);
  EXPECT_EQ(ra->round, 0);
}

TEST(RendezvousTest, ElasticRoundClosesAfterLastCallWithMinNodes) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 1, 2));
  auto started = std::chrono::steady_clock::now();
  auto r = a.Join(nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_GE(std::chrono::steady_clock::now() - started, milliseconds(90));
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->group_world_size, 1);
}

TEST(RendezvousTest, JoinTimeoutNamesWhoCame) {
  MemoryStore store;
  auto o = Options("lonely", 2, 2);
  o.join_timeout = milliseconds(50);
  Rendezvous a(&store, o);
  auto r = a.Join(nullptr);
  ASSERT_EQ(r.status().code(), Status::Code::kTimeout);
  EXPECT_NE(r.status().message().find("1 of min 2 nodes joined (lonely)"),
            std::string::npos);
}

TEST(RendezvousTest, DisagreeingSettingsCloseTheJobForEveryone) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 2, 2));
  auto ob = Options("b", 2, 2);
  ob.nproc_per_node = 4;
  Rendezvous b(&store, ob);
  auto fa = JoinAsync(&a);
  std::this_thread::sleep_for(milliseconds(20));
  auto rb = b.Join(nullptr);
  ASSERT_EQ(rb.status().code(), Status::Code::kInvalid);
  EXPECT_NE(rb.status().message().find("--nproc-per-node=4"),
            std::string::npos);
  auto ra = fa.get();
  EXPECT_EQ(ra.status().code(), Status::Code::kInvalid);
}

TEST(RendezvousTest, WaitingNodeStartsANewRoundWithStableRanks) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 1, 2)), b(&store, Options("b", 1, 2));
  auto first = a.Join(nullptr);
  ASSERT_TRUE(first.ok());
  auto fb = JoinAsync(&b);  // arrives while round 0 runs: waits
  Result<RoundEvent> ev = RoundEvent::kNone;
  for (int i = 0; i < 200 && ev.ok() && *ev == RoundEvent::kNone; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
    ev = a.Check(*first);
  }
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(*ev, RoundEvent::kRestart);
  auto second = a.Join(nullptr);
  auto rb = fb.get();
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(second->round, 1);
  EXPECT_EQ(second->group_rank, 0);  // the node that stayed keeps its rank
  EXPECT_EQ(rb->group_rank, 1);
  EXPECT_EQ(second->world_size, 4);
  EXPECT_EQ(second->failures, 0);  // a membership change is not a failure
}

TEST(RendezvousTest, SilentNodeIsDeclaredDead) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 1, 2)), b(&store, Options("b", 1, 2));
  auto fb = JoinAsync(&b);
  auto ra = a.Join(nullptr);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE(fb.get().ok());
  // b never calls Check again: no heartbeats.
  auto started = std::chrono::steady_clock::now();
  Result<RoundEvent> ev = RoundEvent::kNone;
  while (ev.ok() && *ev == RoundEvent::kNone &&
         std::chrono::steady_clock::now() - started < milliseconds(1000)) {
    std::this_thread::sleep_for(milliseconds(5));
    ev = a.Check(*ra);
  }
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(*ev, RoundEvent::kRestart);
  EXPECT_GE(std::chrono::steady_clock::now() - started, milliseconds(55));
  auto again = a.Join(nullptr);  // alone now (min 1)
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->group_world_size, 1);
}

TEST(RendezvousTest, FailuresCountOncePerRoundThenClose) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 1, 1));
  auto r0 = a.Join(nullptr);
  ASSERT_TRUE(r0.ok());
  EXPECT_EQ(*a.ReportFailure(*r0, "exit 1"), 1);
  EXPECT_EQ(*a.ReportFailure(*r0, "exit 1"),
            1);  // same round: not counted twice
  EXPECT_TRUE(a.closed_reason().empty());
  auto r1 = a.Join(nullptr);
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->round, 1);
  EXPECT_EQ(*a.ReportFailure(*r1, "exit 1"), 2);  // past --max-restarts=1
  EXPECT_NE(a.closed_reason().find("after 1 restart(s)"), std::string::npos);
  EXPECT_EQ(*a.Check(*r1), RoundEvent::kClosed);
}

TEST(RendezvousTest, AllDoneOnceEveryNodeMarksDone) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 2, 2)), b(&store, Options("b", 2, 2));
  auto fb = JoinAsync(&b);
  auto ra = a.Join(nullptr);
  auto rb = fb.get();
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_TRUE(a.MarkDone(*ra).ok());
  EXPECT_EQ(*a.Check(*ra), RoundEvent::kNone);
  ASSERT_TRUE(b.MarkDone(*rb).ok());
  EXPECT_EQ(*a.Check(*ra), RoundEvent::kAllDone);
  EXPECT_EQ(*b.Check(*rb), RoundEvent::kAllDone);
  Rendezvous late(&store, Options("late", 2, 2));
  EXPECT_EQ(late.Join(nullptr).status().code(), Status::Code::kUnavailable);
}

TEST(RendezvousTest, InterruptedJoinReturnsCanceled) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 2, 2));
  EXPECT_EQ(a.Join([] { return true; }).status().code(),
            Status::Code::kCanceled);
}

TEST(RendezvousTest, TwoNodesClaimingOneStaticRankCloseTheJob) {
  MemoryStore store;
  auto oa = Options("a", 3, 3), ob = Options("b", 3, 3);
  oa.node_rank = 0;
  ob.node_rank = 0;
  Rendezvous a(&store, oa), b(&store, ob);
  auto fa = JoinAsync(&a);
  std::this_thread::sleep_for(milliseconds(20));
  auto rb = b.Join(nullptr);
  ASSERT_EQ(rb.status().code(), Status::Code::kInvalid);
  EXPECT_NE(
      rb.status().message().find("two nodes claim --node-rank=0 (a and b)"),
      std::string::npos);
  EXPECT_EQ(fa.get().status().code(), Status::Code::kInvalid);
}

// Why the job ended is an enum in the state record, so every node (and the
// launcher's exit code) gets it without reading the message.

TEST(RendezvousEndTest, ReasonNamesRoundTrip) {
  for (EndReason r :
       {EndReason::kNone, EndReason::kSucceeded, EndReason::kWorkersFailed,
        EndReason::kConfigMismatch, EndReason::kDuplicateNodeRank,
        EndReason::kForeignState}) {
    EndReason parsed = EndReason::kNone;
    ASSERT_TRUE(ParseEndReason(EndReasonName(r), &parsed)) << EndReasonName(r);
    EXPECT_EQ(parsed, r);
  }
  EndReason untouched = EndReason::kSucceeded;
  EXPECT_FALSE(ParseEndReason("workers failed", &untouched));
  EXPECT_EQ(untouched, EndReason::kSucceeded);
}

TEST(RendezvousEndTest, WorkersFailedPastMaxRestartsReachesEveryNode) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 1, 1));
  auto r0 = a.Join(nullptr);
  ASSERT_TRUE(r0.ok());
  ASSERT_EQ(*a.ReportFailure(*r0, "exit 1"), 1);
  EXPECT_EQ(a.end_reason(), EndReason::kNone);
  auto r1 = a.Join(nullptr);
  ASSERT_TRUE(r1.ok());
  ASSERT_EQ(*a.ReportFailure(*r1, "exit 1"), 2);
  EXPECT_EQ(a.end_reason(), EndReason::kWorkersFailed);
  Rendezvous late(&store, Options("late", 1, 1));
  EXPECT_EQ(late.Join(nullptr).status().code(), Status::Code::kInvalid);
  EXPECT_EQ(late.end_reason(), EndReason::kWorkersFailed);
  EXPECT_EQ(late.closed_reason(), a.closed_reason());
  auto record = nlohmann::json::parse(*store.Get("rdzv/job/state"));
  EXPECT_EQ(record.at("end"), "workers_failed");
}

TEST(RendezvousEndTest, ClosedNodesSeeWorkersFailedInCheck) {
  MemoryStore store;
  auto o = Options("a", 2, 2);
  o.max_restarts = 0;
  auto ob = o;
  ob.node_id = "b";
  Rendezvous a(&store, o), b(&store, ob);
  auto fb = JoinAsync(&b);
  auto ra = a.Join(nullptr);
  auto rb = fb.get();
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_EQ(*a.ReportFailure(*ra, "exit 1"), 1);
  EXPECT_EQ(*b.Check(*rb), RoundEvent::kClosed);
  EXPECT_EQ(b.end_reason(), EndReason::kWorkersFailed);
  EXPECT_EQ(b.closed_reason().rfind("workers failed on node a", 0), 0u)
      << b.closed_reason();
}

TEST(RendezvousEndTest, DisagreeingSettingsAreAConfigMismatchForBoth) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 2, 2));
  auto ob = Options("b", 2, 2);
  ob.max_restarts = 3;
  Rendezvous b(&store, ob);
  auto fa = JoinAsync(&a);
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(b.Join(nullptr).status().code(), Status::Code::kInvalid);
  EXPECT_EQ(fa.get().status().code(), Status::Code::kInvalid);
  EXPECT_EQ(b.end_reason(), EndReason::kConfigMismatch);
  EXPECT_EQ(a.end_reason(), EndReason::kConfigMismatch);
}

TEST(RendezvousEndTest, DuplicateStaticRankIsRecordedForBoth) {
  MemoryStore store;
  auto oa = Options("a", 2, 2), ob = Options("b", 2, 2);
  oa.node_rank = 1;
  ob.node_rank = 1;
  Rendezvous a(&store, oa), b(&store, ob);
  auto fa = JoinAsync(&a);
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(b.Join(nullptr).status().code(), Status::Code::kInvalid);
  EXPECT_EQ(fa.get().status().code(), Status::Code::kInvalid);
  EXPECT_EQ(b.end_reason(), EndReason::kDuplicateNodeRank);
  EXPECT_EQ(a.end_reason(), EndReason::kDuplicateNodeRank);
}

TEST(RendezvousEndTest, EveryNodeDoneIsSucceeded) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 1, 1));
  auto ra = a.Join(nullptr);
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(a.end_reason(), EndReason::kNone);
  ASSERT_TRUE(a.MarkDone(*ra).ok());
  EXPECT_EQ(*a.Check(*ra), RoundEvent::kAllDone);
  EXPECT_EQ(a.end_reason(), EndReason::kSucceeded);
  EXPECT_TRUE(a.closed_reason().empty());
  Rendezvous late(&store, Options("late", 1, 1));
  EXPECT_EQ(late.Join(nullptr).status().code(), Status::Code::kUnavailable);
  EXPECT_EQ(late.end_reason(), EndReason::kSucceeded);
}

TEST(RendezvousEndTest, ForeignStateKeyIsNotClosedButNamed) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("rdzv/job/state", "someone else's").ok());
  Rendezvous a(&store, Options("a", 1, 1));
  auto r = a.Join(nullptr);
  ASSERT_EQ(r.status().code(), Status::Code::kInvalid);
  EXPECT_NE(r.status().message().find("is not dtrun's"), std::string::npos);
  EXPECT_EQ(a.end_reason(), EndReason::kForeignState);
  EXPECT_TRUE(a.closed_reason().empty());
  EXPECT_EQ(*store.Get("rdzv/job/state"), "someone else's");
}

// A record written without "end" (older dtrun) still gives the reason.
TEST(RendezvousEndTest, RecordWithoutEndIsReadFromItsMessage) {
  const std::pair<std::string, EndReason> cases[] = {
      {"workers failed on node x (exit 1) after 1 restart(s)",
       EndReason::kWorkersFailed},
      {"two nodes claim --node-rank=0 (x and y); give each node its own rank",
       EndReason::kDuplicateNodeRank},
      {"node x has --nproc-per-node=4 --max-restarts=1 but ...",
       EndReason::kConfigMismatch},
  };
  for (const auto& [message, reason] : cases) {
    MemoryStore store;
    nlohmann::json old = {{"round", 2}, {"failures", 1}, {"closed", message}};
    ASSERT_TRUE(store.Set("rdzv/job/state", old.dump()).ok());
    Rendezvous a(&store, Options("a", 1, 1));
    EXPECT_EQ(a.Join(nullptr).status().code(), Status::Code::kInvalid);
    EXPECT_EQ(a.end_reason(), reason) << message;
    EXPECT_EQ(a.closed_reason(), message);
  }
}

// The enum, not the wording, decides: a reworded message keeps its reason.
TEST(RendezvousEndTest, StoredReasonWinsOverTheMessage) {
  MemoryStore store;
  nlohmann::json record = {{"round", 0},
                           {"failures", 3},
                           {"closed", "the group gave up"},
                           {"end", "workers_failed"}};
  ASSERT_TRUE(store.Set("rdzv/job/state", record.dump()).ok());
  Rendezvous a(&store, Options("a", 1, 1));
  EXPECT_EQ(a.Join(nullptr).status().code(), Status::Code::kInvalid);
  EXPECT_EQ(a.end_reason(), EndReason::kWorkersFailed);
  EXPECT_EQ(a.closed_reason(), "the group gave up");
}

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

// Checks every 2 ms until something happens, for at most 2 s.
Result<RoundEvent> CheckUntilEvent(Rendezvous* node, const Assignment& a) {
  auto started = std::chrono::steady_clock::now();
  Result<RoundEvent> ev = RoundEvent::kNone;
  while (ev.ok() && *ev == RoundEvent::kNone &&
         std::chrono::steady_clock::now() - started < milliseconds(2000)) {
    std::this_thread::sleep_for(milliseconds(2));
    ev = node->Check(a);
  }
  return ev;
}

// Two nodes over a real server, each with a watch connection when `watch`.
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
        o.open_watch = [copts] { return TcpStoreClient::Connect(copts); };
      }
      nodes[i] = std::make_unique<Rendezvous>(counted[i].get(), o);
    }
    auto fb = JoinAsync(nodes[1].get());
    auto ra = nodes[0]->Join(nullptr);
    EXPECT_TRUE(ra.ok());
    auto rb = fb.get();
    EXPECT_TRUE(rb.ok());
    a = *ra;
    b = *rb;
  }
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<TcpStoreClient> clients[2];
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
    std::this_thread::sleep_for(milliseconds(10));
    ASSERT_EQ(*p.nodes[0]->Check(p.a), RoundEvent::kNone);
    ASSERT_EQ(*p.nodes[1]->Check(p.b), RoundEvent::kNone);
  }
  EXPECT_EQ(p.counted[0]->reads, reads);
  EXPECT_EQ(p.counted[1]->reads, reads_b);
  EXPECT_EQ(p.counted[0]->other, other);
  // Group rank 0 still reads its two counters (ADD 0) on every check.
  EXPECT_GE(p.counted[0]->adds + p.counted[1]->adds, 40);
  ASSERT_EQ(*p.nodes[1]->ReportFailure(p.b, "exit 1"), 1);
  // The push may take a moment to arrive; it needs no read to be noticed.
  auto ev = CheckUntilEvent(p.nodes[0].get(), p.a);
  ASSERT_TRUE(ev.ok()) << ev.status().message();
  EXPECT_EQ(*ev, RoundEvent::kRestart);
  EXPECT_EQ(p.counted[0]->reads, reads + 1);  // read once, after the push
}

// The watched node's heartbeats arrive as pushes; when they stop, the node
// is declared dead after keep-alive x attempts, as when reading.
TEST(RendezvousPushTest, ASilentNodeIsDeclaredDeadFromPushes) {
  PushedPair p(true, milliseconds(50));
  auto started = std::chrono::steady_clock::now();
  // Both check for 300 ms (b's beats keep a's view of it alive), then b
  // goes silent.
  while (std::chrono::steady_clock::now() - started < milliseconds(300)) {
    ASSERT_EQ(*p.nodes[0]->Check(p.a), RoundEvent::kNone);
    ASSERT_EQ(*p.nodes[1]->Check(p.b), RoundEvent::kNone);
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_TRUE(p.nodes[0]->pushed(p.a));
  auto silent = std::chrono::steady_clock::now();
  auto ev = CheckUntilEvent(p.nodes[0].get(), p.a);
  ASSERT_TRUE(ev.ok()) << ev.status().message();
  EXPECT_EQ(*ev, RoundEvent::kRestart);
  auto took = std::chrono::steady_clock::now() - silent;
  EXPECT_GE(took, milliseconds(100));  // 150 ms less b's last beat's age
  EXPECT_LT(took, milliseconds(1000));
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
  o.open_watch = [copts] { return TcpStoreClient::Connect(copts); };
  Rendezvous c(p.counted[0].get(), o);
  int reads = p.counted[0]->reads;
  ASSERT_EQ(*c.Check(p.a), RoundEvent::kNone);
  ASSERT_EQ(*c.Check(p.a), RoundEvent::kNone);
  EXPECT_FALSE(c.pushed(p.a));
  EXPECT_EQ(p.counted[0]->reads, reads + 2);
  o.open_watch = [] {
    return Result<std::unique_ptr<TcpStoreClient>>(
        Status::Unavailable("no store here"));
  };
  Rendezvous d(p.counted[0].get(), o);
  ASSERT_EQ(*d.Check(p.a), RoundEvent::kNone);
  EXPECT_EQ(p.counted[0]->reads, reads + 3);
}

}  // namespace
}  // namespace dtrun::rendezvous
