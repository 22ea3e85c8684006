// Rendezvous rounds of several agents, one thread each, over one in-process
// MemoryStore (as gloo's tests run ranks over a HashStore), on simulated
// time: every node reads a FakeClock, and a node that is alone waits through
// a SimulatedStore, so last calls, join timeouts and dead nodes take no real
// time and nothing sleeps. Nodes that must arrive in an order wait for the
// key the first one writes. Rounds over real sockets: rendezvous_tcp_test.cc.
#include "rendezvous/rendezvous.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <tuple>

#include <nlohmann/json.hpp>

#include "rendezvous/memory_store.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/rendezvous_nodes.h"
#include "tests/testing/simulated_store.h"

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;

// Shared with the other rounds' tests (tests/testing/rendezvous_nodes.h).
RendezvousOptions Options(const std::string& id, int min_nodes, int max_nodes) {
  return testing::NodeOptions(id, min_nodes, max_nodes);
}
using testing::JoinAsync;

using testing::FakeClock;
using testing::SimulatedStore;

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

// Counts the requests the rendezvous makes, writes apart (on etcd each is
// a consensus round; reads are not).
class RequestCountingStore : public MemoryStore {
 public:
  Status Set(const std::string& key, std::string_view value) override {
    if (!in_multi_) ++sets;
    return MemoryStore::Set(key, value);
  }
  Result<std::string> Get(const std::string& key) override {
    if (in_multi_) return MemoryStore::Get(key);
    ++reads;
    in_multi_ = true;  // its own wait is not one more request
    auto r = MemoryStore::Get(key);
    in_multi_ = false;
    return r;
  }
  Result<bool> Check(const std::vector<std::string>& keys) override {
    if (!in_multi_) ++reads;
    return MemoryStore::Check(keys);
  }
  Result<int64_t> Add(const std::string& key, int64_t delta) override {
    ++(delta > 0 ? adds : reads);
    return MemoryStore::Add(key, delta);
  }
  Result<std::string> CompareSet(const std::string& key,
                                 std::string_view expected,
                                 std::string_view desired) override {
    ++compare_sets;
    return MemoryStore::CompareSet(key, expected, desired);
  }
  Status MultiSet(const std::vector<std::string>& keys,
                  const std::vector<std::string>& values) override {
    ++multi_sets;
    in_multi_ = true;
    Status s = MemoryStore::MultiSet(keys, values);
    in_multi_ = false;
    return s;
  }
  Result<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& keys) override {
    ++reads;
    in_multi_ = true;
    auto r = MemoryStore::MultiGet(keys);
    in_multi_ = false;
    return r;
  }
  Status Wait(const std::vector<std::string>& keys,
              milliseconds timeout) override {
    if (!in_multi_) ++waits;
    return MemoryStore::Wait(keys, timeout);
  }
  Result<Enlisted> Enlist(const Enlistment& e) override {
    ++enlists;
    return MemoryStore::Enlist(e);
  }
  int requests() const {
    return sets + reads + adds + compare_sets + multi_sets + waits + enlists;
  }
  std::atomic<int> sets{0}, reads{0}, adds{0}, compare_sets{0}, multi_sets{0},
      waits{0}, enlists{0};

 private:
  static inline thread_local bool in_multi_ = false;
};

// A joiner costs the store four requests: its entry (slot, record and
// binding in one), the wait that `final` ends, one read of the state and
// its rank, its first heartbeat. Nobody creates the state; the closer
// alone does more: it claims, reads the records, writes the ranks in one
// request and sets `final`.
TEST(RendezvousTest, AJoinerCostsTheStoreFourRequests) {
  RequestCountingStore store;
  Rendezvous a(&store, Options("a", 4, 4)), b(&store, Options("b", 4, 4)),
      c(&store, Options("c", 4, 4)), d(&store, Options("d", 4, 4));
  auto fa = JoinAsync(&a);
  ASSERT_TRUE(store.Wait({"rdzv/job/round/0/node/1"}, milliseconds(5000)).ok());
  auto fb = JoinAsync(&b), fc = JoinAsync(&c);
  ASSERT_TRUE(store.Wait({"rdzv/job/round/0/node/3"}, milliseconds(5000)).ok());
  auto fd = JoinAsync(&d);
  for (auto* f : {&fa, &fb, &fc, &fd}) {
    auto r = f->get();
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  EXPECT_EQ(store.enlists, 4);
  EXPECT_EQ(store.compare_sets, 2);  // closing, final
  EXPECT_EQ(store.multi_sets, 1);    // the ranks
  EXPECT_EQ(store.adds, 4);          // each first heartbeat
  EXPECT_EQ(store.sets, 1);          // `final` again, for torch's store
  EXPECT_FALSE(*store.Check({"rdzv/job/state"}));
  // The test's own two waits and check are not the nodes'. Each of the three
  // that wait: its wait, its read; the closer: the count, its claim, the
  // records (a wait and a read), the ranks, `final` (twice), its read.
  EXPECT_EQ(store.requests() - 3, 4 * 4 - 1 + 7)
      << "reads " << store.reads << " waits " << store.waits;
}

TEST(RendezvousTest, ElasticRoundClosesAfterLastCallWithMinNodes) {
  MemoryStore store;
  FakeClock clock;
  SimulatedStore alone(&store, &clock);
  Rendezvous a(&alone, Options("a", 1, 2), clock);
  auto r = a.Join(nullptr);
  ASSERT_TRUE(r.ok());
  // The last call is 100 ms; each wait of the round is cut to end with it.
  EXPECT_GE(clock.Elapsed(), milliseconds(100));
  EXPECT_LT(clock.Elapsed(), milliseconds(106));
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->group_world_size, 1);
}

TEST(RendezvousTest, JoinTimeoutNamesWhoCame) {
  MemoryStore store;
  FakeClock clock;
  SimulatedStore alone(&store, &clock);
  auto o = Options("lonely", 2, 2);
  o.join_timeout = milliseconds(50);
  Rendezvous a(&alone, o, clock);
  auto r = a.Join(nullptr);
  ASSERT_EQ(r.status().code(), Status::Code::kTimeout);
  EXPECT_NE(r.status().message().find("1 of min 2 nodes joined (lonely)"),
            std::string::npos);
  EXPECT_EQ(clock.Elapsed(), milliseconds(50));
}

// torchrun's default join timeout, 600 s, as simulated time: the node waits
// in its round 2 s at a time (the store's wake would end any of them), the
// whole time, and gives up on the dot.
TEST(RendezvousTest, DefaultJoinTimeoutRunsOutOnSimulatedTime) {
  MemoryStore store;
  FakeClock clock;
  SimulatedStore alone(&store, &clock);
  auto o = Options("early", 2, 4);
  o.join_timeout = RendezvousOptions().join_timeout;
  o.poll_interval = RendezvousOptions().poll_interval;
  Rendezvous a(&alone, o, clock);
  auto r = a.Join(nullptr);
  ASSERT_EQ(r.status().code(), Status::Code::kTimeout);
  EXPECT_EQ(clock.Elapsed(), std::chrono::minutes(10));
  EXPECT_EQ(alone.simulated_waits(), 300);  // 300 x 2 s
  EXPECT_NE(r.status().message().find("timed out after 600"), std::string::npos)
      << r.status().message();
}

TEST(RendezvousTest, DisagreeingSettingsCloseTheJobForEveryone) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 2, 2));
  auto ob = Options("b", 2, 2);
  ob.nproc_per_node = 4;
  Rendezvous b(&store, ob);
  auto fa = JoinAsync(&a);
  ASSERT_TRUE(store.Wait({"rdzv/job/round/0/node/1"}).ok());  // a came first
  auto rb = b.Join(nullptr);
  ASSERT_EQ(rb.status().code(), Status::Code::kInvalid);
  EXPECT_NE(rb.status().message().find("--nproc-per-node=4"),
            std::string::npos);
  auto ra = fa.get();
  EXPECT_EQ(ra.status().code(), Status::Code::kInvalid);
}

TEST(RendezvousTest, WaitingNodeStartsANewRoundWithStableRanks) {
  MemoryStore store;
  FakeClock clock;
  SimulatedStore alone(&store, &clock);
  Rendezvous a(&alone, Options("a", 1, 2), clock),
      b(&store, Options("b", 1, 2), clock);
  auto first = a.Join(nullptr);  // alone: closes after the last call
  ASSERT_TRUE(first.ok());
  alone.set_simulating(false);  // b waits in the store for real from here
  auto fb = JoinAsync(&b);      // arrives while round 0 runs: waits
  ASSERT_TRUE(store.Wait({"rdzv/job/round/0/waiting"}).ok());
  auto ev = a.Check(*first);
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
  FakeClock clock;
  SimulatedStore a_view(&store, &clock, /*simulating=*/false);
  Rendezvous a(&a_view, Options("a", 1, 2), clock),
      b(&store, Options("b", 1, 2), clock);
  auto fb = JoinAsync(&b);
  auto ra = a.Join(nullptr);  // the second to arrive closes the round
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE(fb.get().ok());
  // b never calls Check again: no heartbeats. a checks every 5 ms.
  auto started = clock.Elapsed();
  Result<RoundEvent> ev = RoundEvent::kNone;
  for (int i = 0; i < 100 && ev.ok() && *ev == RoundEvent::kNone; ++i) {
    clock.Advance(milliseconds(5));
    ev = a.Check(*ra);
  }
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(*ev, RoundEvent::kRestart);
  // First seen at +5 ms; dead once more than 20 ms x 3 passed since then.
  EXPECT_EQ(clock.Elapsed() - started, milliseconds(70));
  a_view.set_simulating(true);
  auto again = a.Join(nullptr);  // alone now (min 1)
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->group_world_size, 1);
}

// Joins b and c on threads of their own, then a, the third, which closes
// the round (of at most 3 nodes).
std::tuple<Result<Assignment>, Result<Assignment>, Result<Assignment>>
JoinThree(Store* store, Rendezvous* a, Rendezvous* b, Rendezvous* c) {
  auto fb = JoinAsync(b), fc = JoinAsync(c);
  (void)store->Wait({"rdzv/job/round/0/node/2"}, milliseconds(5000));
  auto ra = a->Join(nullptr);
  return {std::move(ra), fb.get(), fc.get()};
}

// A store with leases as the rendezvous sees them (etcd's are in
// etcd_store_test.cc): a leased key is set; the test ends a lease by
// deleting its key, as etcd does when renewals stop.
class LeasingStore : public MemoryStore {
 public:
  bool has_leases() const override { return true; }
  Status LeaseKey(const std::string& key, milliseconds ttl) override {
    std::lock_guard<std::mutex> lock(mu_);
    ttl_ = ttl;
    if (key.empty()) return last_.empty() ? Status::Ok() : Set(last_, "left");
    leased_.push_back(key);
    last_ = key;
    return Set(key, "1");
  }
  void StillAlive() override { ++touches; }
  Result<int64_t> Add(const std::string& key, int64_t delta) override {
    if (delta > 0 && key.find("/hb/") != std::string::npos) ++beats;
    return MemoryStore::Add(key, delta);
  }
  std::vector<std::string> leased() {
    std::lock_guard<std::mutex> lock(mu_);
    return leased_;
  }
  std::atomic<int> touches{0}, beats{0};
  milliseconds ttl_{0};

 private:
  std::mutex mu_;
  std::vector<std::string> leased_;
  std::string last_;
};

// Where the store has leases, a node's key under its lease replaces its
// heartbeats: no beats are written, its silence is no death while the key
// stands, and the key's end (a deletion) is its death at once. A node that
// leaves on purpose detaches its key first.
TEST(RendezvousTest, ALeasedNodesEndedLeaseIsItsDeath) {
  LeasingStore store;
  FakeClock clock;
  Rendezvous a(&store, Options("a", 1, 3), clock),
      b(&store, Options("b", 1, 3), clock),
      c(&store, Options("c", 1, 3), clock);
  auto [ra, rb, rc] = JoinThree(&store, &a, &b, &c);
  ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok());
  ASSERT_EQ(store.leased().size(), 3u);
  EXPECT_EQ(store.ttl_, milliseconds(60));  // the silent limit
  std::map<int, Rendezvous*> by_rank = {
      {ra->group_rank, &a}, {rb->group_rank, &b}, {rc->group_rank, &c}};
  std::map<int, Assignment> as = {
      {ra->group_rank, *ra}, {rb->group_rank, *rb}, {rc->group_rank, *rc}};
  // Ten silent limits: nobody beats, nobody is declared dead.
  for (int i = 0; i < 120; ++i) {
    clock.Advance(milliseconds(5));
    for (auto& [rank, r] : by_rank)
      ASSERT_EQ(*r->Check(as[rank]), RoundEvent::kNone);
  }
  EXPECT_EQ(store.beats, 0);
  EXPECT_GE(store.touches, 300);
  // Rank 2 leaves on purpose: its key stays ("left"), no death.
  ASSERT_TRUE(by_rank[2]->MarkDone(as[2]).ok());
  for (int i = 0; i < 40; ++i) {
    clock.Advance(milliseconds(5));
    for (int rank : {0, 1})
      ASSERT_EQ(*by_rank[rank]->Check(as[rank]), RoundEvent::kNone);
  }
  // Rank 1's lease ends: rank 0, which watches it, starts the next round.
  // Its key is named by its node id (put by its entry, before it had a
  // rank).
  std::map<int, std::string> id_of = {
      {ra->group_rank, "a"}, {rb->group_rank, "b"}, {rc->group_rank, "c"}};
  const std::string key = "rdzv/job/round/0/alive/" + id_of[1];
  ASSERT_TRUE(*store.DeleteKey(key));
  EXPECT_EQ(*by_rank[0]->Check(as[0]), RoundEvent::kRestart);
  EXPECT_EQ(*by_rank[1]->Check(as[1]), RoundEvent::kRestart);
}

// A stream that stands and never pushes: a quiet round, in push mode.
class QuietWatch : public KeyWatch {
 public:
  Status WatchKey(const std::string&) override { return Status::Ok(); }
  Status TakeChanges(std::vector<KeyChange>*) override { return Status::Ok(); }
};

// A leasing store that can stop answering reads (an etcd without quorum).
class OutageStore : public LeasingStore {
 public:
  Result<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& keys) override {
    if (down) return Status::Unavailable("no quorum");
    return LeasingStore::MultiGet(keys);
  }
  std::atomic<bool> down{false};
};

// The store went away before the watching node's first read of the round
// came through, so the first read that sees the watched node's lease comes
// when its silence is over the limit: the lease tells from then on, not the
// heartbeats a leased node never writes (they were taken for a death).
TEST(RendezvousTest, ALeaseFirstSeenAfterAnOutageIsNoDeath) {
  OutageStore store;
  FakeClock clock;
  auto o = Options("a", 2, 2);
  o.open_watch = []() -> Result<std::unique_ptr<KeyWatch>> {
    return std::unique_ptr<KeyWatch>(new QuietWatch);
  };
  Rendezvous a(&store, o, clock), b(&store, Options("b", 2, 2), clock);
  auto fb = JoinAsync(&b);
  auto ra = a.Join(nullptr);
  auto rb = fb.get();
  ASSERT_TRUE(ra.ok() && rb.ok());
  store.down = true;
  EXPECT_FALSE(a.Check(*ra).ok());  // the round's first read fails
  store.down = false;
  for (int i = 0; i < 20; ++i) {  // a second over the 60 ms silent limit
    clock.Advance(milliseconds(5));
    ASSERT_EQ(*a.Check(*ra), RoundEvent::kNone) << "check " << i;
  }
  EXPECT_EQ(store.beats, 0);
  // and the lease's end is still a death at once
  ASSERT_TRUE(*store.DeleteKey("rdzv/job/round/0/alive/b"));
  ASSERT_TRUE(store.Set("rdzv/job/round/0/over", "1").ok());
  clock.Advance(milliseconds(100));
  EXPECT_EQ(*a.Check(*ra), RoundEvent::kRestart);
}

// A round started because a node was declared dead expects the others
// (StateDoc::expect): once they are back it closes at once, where it would
// wait out the last call for nodes up to the maximum. The clock stands
// still while they join: a round waiting for its last call would never
// close.
TEST(RendezvousTest, ARoundAfterADeathClosesOnceTheSurvivorsAreBack) {
  MemoryStore store;
  FakeClock clock;
  Rendezvous a(&store, Options("a", 1, 3), clock),
      b(&store, Options("b", 1, 3), clock),
      c(&store, Options("c", 1, 3), clock);
  auto [ra, rb, rc] = JoinThree(&store, &a, &b, &c);
  ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok());
  // c falls silent; a and b check until one declares it dead.
  bool restarted = false;
  for (int i = 0; i < 100 && !restarted; ++i) {
    clock.Advance(milliseconds(5));
    for (auto [r, as] : {std::pair{&a, *ra}, std::pair{&b, *rb}}) {
      auto ev = r->Check(as);
      ASSERT_TRUE(ev.ok());
      restarted = restarted || *ev == RoundEvent::kRestart;
    }
  }
  ASSERT_TRUE(restarted);
  StateDoc doc;
  ASSERT_TRUE(StateDoc::Parse(*store.Get("rdzv/job/state"), &doc));
  EXPECT_EQ(doc.round, 1);
  EXPECT_EQ(doc.expect, 2);
  const auto before = clock.Elapsed();
  auto fa1 = JoinAsync(&a), fb1 = JoinAsync(&b);
  const bool ready =
      fa1.wait_for(std::chrono::seconds(10)) == std::future_status::ready &&
      fb1.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!ready) clock.Advance(milliseconds(200));  // past the last call
  EXPECT_TRUE(ready) << "the round waited for its last call";
  auto a1 = fa1.get(), b1 = fb1.get();
  ASSERT_TRUE(a1.ok() && b1.ok()) << a1.status().message();
  EXPECT_EQ(a1->group_world_size, 2);
  EXPECT_EQ(clock.Elapsed(), before);
}

// A failure restarts every node's group: the round expects them all.
TEST(RendezvousTest, ARoundAfterAFailureExpectsEveryNode) {
  MemoryStore store;
  Rendezvous a(&store, Options("a", 1, 3)), b(&store, Options("b", 1, 3)),
      c(&store, Options("c", 1, 3));
  auto [ra, rb, rc] = JoinThree(&store, &a, &b, &c);
  ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok());
  ASSERT_TRUE(a.ReportFailure(*ra, "worker exited 1").ok());
  StateDoc doc;
  ASSERT_TRUE(StateDoc::Parse(*store.Get("rdzv/job/state"), &doc));
  EXPECT_EQ(doc.round, 1);
  EXPECT_EQ(doc.expect, 3);
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
  ASSERT_TRUE(store.Wait({"rdzv/job/round/0/static/0"}).ok());  // a's claim
  auto rb = b.Join(nullptr);
  ASSERT_EQ(rb.status().code(), Status::Code::kInvalid);
  EXPECT_NE(
      rb.status().message().find("two nodes claim --node-rank=0 (a and b)"),
      std::string::npos);
  EXPECT_EQ(fa.get().status().code(), Status::Code::kInvalid);
}

// Why the job ended is an enum in the state record, so every node (and the
// launcher's exit code) gets it without reading the message.

// The names round trip: round_state_test.cc, EndReasonTest.NamesRoundTrip.

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
  ASSERT_TRUE(store.Wait({"rdzv/job/round/0/node/1"}).ok());  // a came first
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
  ASSERT_TRUE(store.Wait({"rdzv/job/round/0/static/1"}).ok());  // a's claim
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

}  // namespace
}  // namespace dtrun::rendezvous
