// Our server with our client and with hand-made bytes over real loopback
// sockets: both dialects, partial frames, and every bad-input path.
#include "rendezvous/store_server.h"

#include <sys/resource.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "rendezvous/util/log.h"
#include "rendezvous/round_state.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_state.h"
#include "tests/testing/dialect_param.h"
#include "tests/testing/log_capture.h"
#include "tests/testing/loopback_server.h"
#include "tests/testing/raw_conn.h"

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;
using testing::RawConn;

std::string Encode(Request req, Dialect d) {
  std::string out;
  EncodeRequest(req, d, &out);
  return out;
}

// wire.h's, with no keys by default.
Request Req(Op op, std::vector<std::string> keys = {},
            std::vector<std::string> values = {}, int64_t number = 0) {
  return MakeRequest(op, std::move(keys), std::move(values), number);
}

std::string Validate() {
  Request v = Req(Op::kValidate);
  v.word = kValidateMagic;
  return Encode(v, Dialect::kTorch2);
}

class StoreServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreServerOptions opts;
    opts.host = "127.0.0.1";
    opts.limits.max_value_bytes = 1 << 20;
    auto server = StoreServer::Start(opts);
    ASSERT_TRUE(server.ok()) << server.status().message();
    server_ = std::move(*server);
    server_->RunInBackground();
  }
  void TearDown() override { server_->Stop(); }

  std::unique_ptr<TcpStoreClient> Client(
      Dialect d = Dialect::kTorch2, milliseconds timeout = milliseconds(2000)) {
    StoreClientOptions opts;
    opts.port = server_->port();
    opts.dialect = d;
    opts.timeout = timeout;
    opts.connect_timeout = milliseconds(2000);
    auto client = TcpStoreClient::Connect(opts);
    EXPECT_TRUE(client.ok()) << client.status().message();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // The server still serves a well-behaved client.
  void ExpectServing() {
    auto c = Client();
    ASSERT_TRUE(c);
    EXPECT_EQ(*c->Add("alive", 1), 1 + alive_++);
  }

  std::string Warnings() { return log_.Text(); }

  std::unique_ptr<StoreServer> server_;
  testing::ScopedLogCapture log_{"dtrun.store"};
  int alive_ = 0;
};

class StoreServerDialectTest : public StoreServerTest,
                               public ::testing::WithParamInterface<Dialect> {};

TEST_P(StoreServerDialectTest, ClientRunsEveryOperation) {
  auto c = Client(GetParam());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->Set("k", "v").ok());
  EXPECT_EQ(*c->Get("k"), "v");
  EXPECT_EQ(*c->Add("n", 5), 5);
  EXPECT_EQ(*c->Add("n", -7), -2);
  EXPECT_EQ(*c->CompareSet("k", "v", "w"), "w");
  EXPECT_EQ(*c->CompareSet("k", "v", "z"), "w");
  EXPECT_EQ(*c->CompareSet("fresh", "", "x"), "x");
  EXPECT_TRUE(*c->Check({"k", "n"}));
  EXPECT_FALSE(*c->Check({"k", "missing"}));
  EXPECT_EQ(*c->NumKeys(), 3);
  EXPECT_TRUE(*c->DeleteKey("k"));
  EXPECT_FALSE(*c->DeleteKey("k"));
  EXPECT_TRUE(c->Wait({"n", "fresh"}, milliseconds(100)).ok());
}

TEST_P(StoreServerDialectTest, WaitReleasesWhenAnotherClientSets) {
  auto waiter = Client(GetParam());
  auto setter = Client(GetParam());
  std::thread t([&] { setter->Set("late", "1"); });
  EXPECT_TRUE(waiter->Wait({"late"}, milliseconds(2000)).ok());
  t.join();
}

TEST_P(StoreServerDialectTest, WaitTimeoutLeavesClientInSync) {
  auto c = Client(GetParam());
  Status s = c->Wait({"never"}, milliseconds(50));
  EXPECT_EQ(s.code(), Status::Code::kTimeout);
  EXPECT_NE(s.message().find("[never]"), std::string::npos);
  EXPECT_NE(s.message().find("127.0.0.1:"), std::string::npos);
  // The key appears after the timeout; the next reply must still be ours.
  auto other = Client(GetParam());
  other->Set("never", "now");
  EXPECT_EQ(*c->Add("counter", 3), 3);
  EXPECT_EQ(*c->Get("never"), "now");
}

INSTANTIATE_TEST_SUITE_P(BothDialects, StoreServerDialectTest,
                         testing::BothDialects(), testing::DialectName);

TEST_F(StoreServerTest, BarrierAndAppendOverTorch2) {
  auto a = Client();
  auto b = Client();
  std::thread t(
      [&] { EXPECT_TRUE(b->Barrier("bar", 2, milliseconds(2000)).ok()); });
  EXPECT_TRUE(a->Barrier("bar", 2, milliseconds(2000)).ok());
  t.join();
  a->Append("log", "x");
  a->Append("log", "y");
  EXPECT_EQ(*a->Get("log"), "xy");
  Status s = a->Barrier("lonely", 2, milliseconds(30));
  EXPECT_EQ(s.code(), Status::Code::kTimeout);
  EXPECT_EQ(*a->Add("after", 1), 1);
}

// 1.13's protocol has no APPEND or BARRIER: the client refuses them instead
// of sending a request the server would read as something else.
TEST_F(StoreServerTest, AppendAndBarrierOverTorch113AreRefusedNotSent) {
  auto c = Client(Dialect::kTorch113);
  ASSERT_TRUE(c->Set("log", "x").ok());
  Status append = c->Append("log", "y");
  EXPECT_EQ(append.code(), Status::Code::kInvalid);
  EXPECT_NE(append.message().find("torch>=2.2 dialect"), std::string::npos);
  EXPECT_EQ(c->Barrier("bar", 1, milliseconds(100)).code(),
            Status::Code::kInvalid);
  EXPECT_EQ(*c->Get("log"), "x");  // nothing was sent; the stream is in step
  EXPECT_EQ(*c->Add("after", 1), 1);
}

// WATCH_KEY on a connection of its own: the store pushes each change of the
// watched keys, in order, with the key as the client named it.
TEST_F(StoreServerTest, WatchKeyPushesEveryChangeInOrder) {
  auto w = Client(Dialect::kTorch113);
  auto c = Client();
  ASSERT_TRUE(w->WatchKey("hb/1").ok());
  ASSERT_TRUE(w->WatchKey("over").ok());
  std::vector<KeyChange> got;
  ASSERT_TRUE(w->TakeChanges(&got).ok());
  EXPECT_TRUE(got.empty());
  ASSERT_EQ(*c->Add("hb/1", 1), 1);
  ASSERT_EQ(*c->Add("hb/1", 1), 2);
  ASSERT_TRUE(c->Set("unwatched", "x").ok());
  ASSERT_TRUE(c->Set("over", "1").ok());
  ASSERT_TRUE(*c->DeleteKey("hb/1"));
  auto deadline = std::chrono::steady_clock::now() + milliseconds(2000);
  while (got.size() < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
    ASSERT_TRUE(w->TakeChanges(&got).ok());
  }
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].kind, KeyChange::Kind::kCreated);
  EXPECT_EQ(got[0].key, "hb/1");
  EXPECT_EQ(got[0].value, "1");
  EXPECT_EQ(got[1].kind, KeyChange::Kind::kUpdated);
  EXPECT_EQ(got[1].value, "2");
  EXPECT_EQ(got[2].key, "over");
  EXPECT_EQ(got[3].kind, KeyChange::Kind::kDeleted);
  EXPECT_EQ(got[3].value, "");
  // A registration made while changes are arriving still finds its
  // acknowledgement among them.
  ASSERT_TRUE(c->Set("over", "2").ok());
  ASSERT_TRUE(w->WatchKey("late").ok());
  ASSERT_TRUE(c->Set("late", "L").ok());
  got.clear();
  while (got.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(w->TakeChanges(&got).ok());
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].value, "2");
  EXPECT_EQ(got[1].key, "late");
}

TEST_F(StoreServerTest, WatchKeyNeedsThe113DialectAndALiveConnection) {
  auto c = Client();
  Status s = c->WatchKey("k");
  EXPECT_EQ(s.code(), Status::Code::kInvalid);
  EXPECT_NE(s.message().find("torch-1.13 protocol"), std::string::npos);
  EXPECT_EQ(*c->Add("after", 1), 1);  // nothing was sent
  auto w = Client(Dialect::kTorch113);
  ASSERT_TRUE(w->WatchKey("k").ok());
  server_->Stop();
  std::vector<KeyChange> got;
  Status lost = w->TakeChanges(&got);
  for (int i = 0; i < 2000 && lost.ok(); ++i) {
    std::this_thread::sleep_for(milliseconds(1));
    lost = w->TakeChanges(&got);
  }
  EXPECT_EQ(lost.code(), Status::Code::kUnavailable);
  EXPECT_EQ(w->WatchKey("k").code(), Status::Code::kUnavailable);
}

TEST_F(StoreServerTest, BuffersFramesArrivingOneByteAtATime) {
  RawConn conn(server_->port());
  std::string bytes =
      Encode(Req(Op::kSet, {"/k"}, {"value"}), Dialect::kTorch113) +
      Encode(Req(Op::kGet, {"/k"}), Dialect::kTorch113);
  for (char c : bytes) ASSERT_TRUE(conn.Send(std::string(1, c)));
  std::string expected;
  PutBytes(&expected, "value");
  EXPECT_EQ(conn.Read(expected.size()), expected);
}

TEST_F(StoreServerTest, AnswersManyPipelinedRequestsInOneRead) {
  RawConn conn(server_->port());
  std::string bytes;
  for (int i = 0; i < 100; ++i)
    bytes += Encode(Req(Op::kAdd, {"/c"}, {}, 1), Dialect::kTorch113);
  ASSERT_TRUE(conn.Send(bytes));
  std::string replies = conn.Read(800);
  ASSERT_EQ(replies.size(), 800u);
  int64_t last = 0;
  size_t pos = 792;
  GetI64(replies, &pos, &last);
  EXPECT_EQ(last, 100);
}

TEST_F(StoreServerTest, UnknownOpcodeClosesOnlyThatConnection) {
  auto good = Client();
  good->Set("kept", "1");
  RawConn bad(server_->port());
  bad.Send(std::string(1, '\x2a'));
  EXPECT_TRUE(bad.ClosedByPeer());
  EXPECT_EQ(*good->Get("kept"), "1");
  EXPECT_NE(Warnings().find("unknown opcode 42"), std::string::npos);
  EXPECT_NE(Warnings().find("127.0.0.1:"), std::string::npos);
  ExpectServing();
}

TEST_F(StoreServerTest, LengthAboveCapClosesWithoutAllocating) {
  RawConn bad(server_->port());
  std::string frame(1, '\0');
  PutU64(&frame, 1);
  frame += "k";
  PutU64(&frame, uint64_t(1) << 40);  // a 1 TiB value
  bad.Send(frame);
  EXPECT_TRUE(bad.ClosedByPeer());
  EXPECT_NE(Warnings().find("value length 1099511627776 exceeds the cap"),
            std::string::npos);
  ExpectServing();
}

TEST_F(StoreServerTest, TruncatedFrameThenDisconnectIsHarmless) {
  {
    RawConn conn(server_->port());
    std::string frame =
        Encode(Req(Op::kSet, {"/t"}, {"0123456789"}), Dialect::kTorch113);
    conn.Send(frame.substr(0, frame.size() - 3));
  }
  ExpectServing();
  auto c = Client();
  EXPECT_FALSE(*c->Check({"t"}));
}

TEST_F(StoreServerTest, SilentClientDoesNotBlockOthers) {
  RawConn silent(server_->port());
  ASSERT_TRUE(silent.ok());
  ExpectServing();
  EXPECT_FALSE(silent.ClosedByPeer(milliseconds(50)));
}

TEST_F(StoreServerTest, ClientDisconnectingMidWaitIsForgotten) {
  {
    RawConn waiter(server_->port());
    waiter.Send(Encode(Req(Op::kWait, {"/w1", "/w2"}), Dialect::kTorch113));
    auto c = Client();
    c->Add("sync", 1);  // the WAIT above was handled before this
  }
  auto c = Client();
  c->Set("w1", "1");
  c->Set("w2", "1");
  ExpectServing();
  size_t waiters = 1;
  server_->WithState([&](StoreState& s) { waiters = s.NumWaiters(); });
  EXPECT_EQ(waiters, 0u);
}

TEST_F(StoreServerTest, WrongValidateMagicIsRejected) {
  RawConn bad(server_->port());
  std::string frame(1, '\0');
  PutU32(&frame, 0x12345678);
  PutU32(&frame, 0);
  bad.Send(frame);
  EXPECT_TRUE(bad.ClosedByPeer());
  EXPECT_NE(Warnings().find("wrong magic 0x12345678"), std::string::npos);
  ExpectServing();
}

TEST_F(StoreServerTest, Torch2ConnectionMustStartWithValidate) {
  RawConn conn(server_->port());
  conn.Send(Validate() + Encode(Req(Op::kGetNumKeys), Dialect::kTorch2));
  EXPECT_EQ(conn.Read(8).size(), 8u);
  ExpectServing();
}

TEST_F(StoreServerTest, AddToTextValueClosesThatConnection) {
  auto c = Client();
  c->Set("text", "abc");
  auto r = c->Add("text", 1);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(Warnings().find("not a decimal integer"), std::string::npos);
  EXPECT_EQ(*c->Get("text"), "abc");  // the client reconnects
}

// A client that binds on-close keys: its connection closing (the server
// closing it here, then the client going away) counts in one key, each
// (re)connection's bind in the other, so a reconnect is not a death.
TEST_F(StoreServerTest, ABoundClientsClosesAndBindsAreCounted) {
  auto c = Client();
  auto w = Client();
  ASSERT_TRUE(c && w);
  ASSERT_TRUE(c->BindOnClose("gone", "bound").ok());
  EXPECT_FALSE(*w->Check({"bound"}));  // the first binding is implied
  EXPECT_FALSE(*w->Check({"gone"}));
  c->Set("text", "abc");
  EXPECT_FALSE(c->Add("text", 1).ok());  // the server closes c's connection
  EXPECT_EQ(*c->Get("text"), "abc");     // c reconnects, and binds again
  EXPECT_EQ(*w->Get("bound"), "1");
  ASSERT_TRUE(w->Wait({"gone"}, milliseconds(2000)).ok());
  EXPECT_EQ(*w->Get("gone"), "1");
  EXPECT_FALSE(GoneOf(*w->Get("gone"), *w->Get("bound")));
  c.reset();
  for (int i = 0; i < 200 && *w->Get("gone") != "2"; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_TRUE(GoneOf(*w->Get("gone"), *w->Get("bound")));
  // An unbound client's close counts nowhere.
  auto u = Client();
  ASSERT_TRUE(u->BindOnClose("gone_u", "bound_u").ok());
  ASSERT_TRUE(u->BindOnClose("", "").ok());
  u.reset();
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(*w->Check({"gone_u"}));
}

// A joiner's slot, record and binding are one request (kEnlistKey); the
// store keeps nothing under that key, and the binding counts the close.
TEST_F(StoreServerTest, AnEnlistTakesASlotStoresTheRecordAndBinds) {
  auto a = Client(), b = Client(), w = Client();
  ASSERT_TRUE(a && b && w);
  Store::Enlistment e;
  e.counter = "r/n";
  e.records = "r/node/";
  e.id = "a";
  e.record = "rec a";
  e.closes = "r/gone/";
  e.rebinds = "r/bound/";
  auto ea = a->Enlist(e);
  ASSERT_TRUE(ea.ok()) << ea.status().message();
  e.record = "rec b";
  auto eb = b->Enlist(e);
  ASSERT_TRUE(eb.ok());
  EXPECT_EQ(ea->slot, 1);
  EXPECT_EQ(eb->slot, 2);
  EXPECT_TRUE(ea->bound);
  EXPECT_EQ(*w->Get("r/n"), "2");
  auto records = w->ReadEnlisted("r/node/", 2, milliseconds(0));
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(*records, (std::vector<std::string>{"rec a", "rec b"}));
  EXPECT_FALSE(*w->Check({"dtrun/.enlist"}));
  b.reset();
  ASSERT_TRUE(w->Wait({"r/gone/2"}, milliseconds(2000)).ok());
  EXPECT_TRUE(GoneOf(*w->Get("r/gone/2"), ""));
  EXPECT_FALSE(*w->Check({"r/gone/1"}));
}

// A payload without its parts is bad input: only that connection closes.
TEST_F(StoreServerTest, AMalformedEnlistClosesOnlyItsConnection) {
  auto bad = Client(), good = Client();
  ASSERT_TRUE(bad && good);
  EXPECT_FALSE(bad->CompareSet("dtrun/.enlist", "r/n", "no parts").ok());
  EXPECT_TRUE(good->Set("still", "here").ok());
  EXPECT_FALSE(*good->Check({"r/n"}));
}

TEST_F(StoreServerTest, ServesAThousandIdleConnections) {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 2200 && lim.rlim_max >= 2200) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 1000; ++i) {
    idle.push_back(std::make_unique<RawConn>(server_->port()));
    ASSERT_TRUE(idle.back()->ok()) << "connection " << i;
  }
  ExpectServing();
  EXPECT_GE(server_->NumConnections(), 1000u);
}

TEST_F(StoreServerTest, StopClosesEveryConnection) {
  RawConn conn(server_->port());
  ExpectServing();
  server_->Stop();
  EXPECT_TRUE(conn.ClosedByPeer());
}

// A client that pipelines GETs of a large value without reading the replies
// is not read from once its replies pass max_pending_reply_bytes; requests
// it sends meanwhile wait in the kernel, and all are answered, in order,
// once it reads.
TEST(StoreServerBackpressureTest, HeldBackConnectionResumesWithWaitingBytes) {
  StoreServerOptions opts = testing::LoopbackServerOptions();
  opts.max_pending_reply_bytes = 64 << 10;
  auto server = StoreServer::Start(opts);
  ASSERT_TRUE(server.ok()) << server.status().message();
  (*server)->RunInBackground();
  const std::string value(256 << 10, 'v');
  RawConn conn((*server)->port());
  ASSERT_TRUE(
      conn.Send(Encode(Req(Op::kSet, {"big"}, {value}), Dialect::kTorch113)));
  std::string gets;
  for (int i = 0; i < 8; ++i)
    gets += Encode(Req(Op::kGet, {"big"}), Dialect::kTorch113);
  ASSERT_TRUE(conn.Send(gets));
  // The server now holds replies past its limit and stops reading; these
  // arrive while nothing is reading the socket.
  std::this_thread::sleep_for(milliseconds(100));
  ASSERT_TRUE(conn.Send(gets));
  ASSERT_TRUE(conn.Send(Encode(Req(Op::kGetNumKeys), Dialect::kTorch113)));
  ASSERT_TRUE(conn.Send(
      Encode(Req(Op::kSet, {"sent while held"}, {"1"}), Dialect::kTorch113)));
  // Held indeed: another connection does not see that SET yet.
  auto num_keys = [&] {
    RawConn other((*server)->port());
    other.Send(Encode(Req(Op::kGetNumKeys), Dialect::kTorch113));
    std::string r = other.Read(8);
    int64_t n = -1;
    size_t at = 0;
    GetI64(r, &at, &n);
    return n;
  };
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(num_keys(), 1);
  const size_t reply = 8 + value.size();
  std::string replies = conn.Read(16 * reply + 8, std::chrono::seconds(10));
  ASSERT_EQ(replies.size(), 16 * reply + 8);
  for (size_t i = 0; i < 16; ++i) {
    uint64_t len = 0;
    size_t pos = i * reply;
    GetU64(replies, &pos, &len);
    ASSERT_EQ(len, value.size()) << "reply " << i;
    EXPECT_EQ(replies.compare(pos, value.size(), value), 0) << "reply " << i;
  }
  int64_t keys = 0;
  size_t pos = 16 * reply;
  GetI64(replies, &pos, &keys);
  EXPECT_EQ(keys, 1);
  // Reading the replies let the server read on, through to the SET.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (num_keys() != 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(num_keys(), 2);
  (*server)->Stop();
}

TEST(StoreServerListenTest, BusyPortIsAClearError) {
  auto first = StoreServer::Start(testing::LoopbackServerOptions());
  ASSERT_TRUE(first.ok());
  StoreServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = (*first)->port();
  auto second = StoreServer::Start(opts);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("Address already in use"),
            std::string::npos);
  EXPECT_NE(second.status().message().find("--port"), std::string::npos);
}

TEST(StoreClientConnectTest, NamesAddressWhenNothingListens) {
  uint16_t port = 0;
  {
    auto probe = StoreServer::Start(testing::LoopbackServerOptions());
    port = (*probe)->port();
  }
  StoreClientOptions opts;
  opts.port = port;
  opts.connect_timeout = milliseconds(200);
  auto c = TcpStoreClient::Connect(opts);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("127.0.0.1:" + std::to_string(port)),
            std::string::npos);
  EXPECT_NE(c.status().message().find("Connection refused"), std::string::npos);
}

TEST(AcceptQueueAdviceTest, SaysWhenABurstOutgrowsTheListenQueue) {
  EXPECT_EQ(AcceptQueueAdvice(4096, 4096), "");
  EXPECT_EQ(AcceptQueueAdvice(16, -1), "");  // somaxconn unknown
  std::string advice = AcceptQueueAdvice(8192, 4096);
  EXPECT_NE(advice.find("8192 connections (workers, or their nodes' proxies)"),
            std::string::npos)
      << advice;
  EXPECT_NE(advice.find("net.core.somaxconn is 4096"), std::string::npos);
  EXPECT_NE(advice.find("sysctl -w net.core.somaxconn=65535"),
            std::string::npos);
  EXPECT_NE(advice.find("--store-proxy=on"), std::string::npos);
}

}  // namespace
}  // namespace dtrun::rendezvous
