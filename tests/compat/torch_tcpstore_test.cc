// libtorch's own c10d::TCPStore against our server, and our client against
// libtorch's server: every public operation, both ways. Builds against
// libtorch 1.13 (the host) and 2.x (the trixie root, ctest label compat2).
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"
#include "tests/testing/loopback_server.h"

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;

std::vector<uint8_t> B(const std::string& s) { return {s.begin(), s.end()}; }
std::string S(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

#if TORCH_VERSION_MAJOR >= 2
constexpr Dialect kTorchDialect = Dialect::kTorch2;
#else
constexpr Dialect kTorchDialect = Dialect::kTorch113;
#endif

c10d::TCPStoreOptions ClientOpts(uint16_t port,
                                 c10::optional<size_t> workers = c10::nullopt) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = false;
  opts.numWorkers = workers;
  opts.timeout = milliseconds(5000);
#if TORCH_VERSION_MAJOR >= 2
  opts.useLibUV = false;  // Debian's 2.6 is built without libuv
#endif
  return opts;
}

class TorchClientOnOurServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StoreServer::Start(testing::LoopbackServerOptions());
    ASSERT_TRUE(server.ok());
    server_ = std::move(*server);
    server_->RunInBackground();
  }
  std::unique_ptr<StoreServer> server_;
};

TEST_F(TorchClientOnOurServerTest, EveryPublicOperation) {
  c10d::TCPStore store("127.0.0.1", ClientOpts(server_->port(), 1));
  store.set("k", B("v"));
  EXPECT_EQ(S(store.get("k")), "v");
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -2), 3);
  EXPECT_EQ(S(store.get("n")), "3");
  EXPECT_EQ(S(store.compareSet("k", B("v"), B("w"))), "w");
  EXPECT_EQ(S(store.compareSet("k", B("v"), B("z"))), "w");
  EXPECT_EQ(S(store.compareSet("new", B(""), B("x"))), "x");
  EXPECT_EQ(S(store.compareSet("absent", B("e"), B("x"))), "e");
  EXPECT_TRUE(store.check({"k", "n"}));
  EXPECT_FALSE(store.check({"k", "absent"}));
  store.wait({"k", "new"});
  store.wait({"k"}, milliseconds(100));
  // init/ (from numWorkers), /k, /n, /new
  EXPECT_EQ(store.getNumKeys(), 4);
  EXPECT_TRUE(store.deleteKey("k"));
  EXPECT_FALSE(store.deleteKey("k"));
  EXPECT_EQ(store.getNumKeys(), 3);
}

TEST_F(TorchClientOnOurServerTest, WaitTimesOutOnClientSide) {
  c10d::TCPStore store("127.0.0.1", ClientOpts(server_->port()));
  auto start = std::chrono::steady_clock::now();
  EXPECT_ANY_THROW(store.wait({"never"}, milliseconds(200)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(150));
}

TEST_F(TorchClientOnOurServerTest, WaitReleasedBySecondClient) {
  c10d::TCPStore waiter("127.0.0.1", ClientOpts(server_->port()));
  c10d::TCPStore setter("127.0.0.1", ClientOpts(server_->port()));
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(20));
    setter.set("late", B("1"));
  });
  waiter.wait({"late"}, milliseconds(3000));
  t.join();
  EXPECT_EQ(S(waiter.get("late")), "1");
}

#if TORCH_VERSION_MAJOR >= 2
TEST_F(TorchClientOnOurServerTest, AppendMultiGetMultiSet) {
  c10d::TCPStore store("127.0.0.1", ClientOpts(server_->port()));
  EXPECT_TRUE(store.hasExtendedApi());
  store.append("log", B("a"));
  store.append("log", B("b"));
  store.multiSet({"x", "y"}, {B("1"), B("2")});
  auto got = store.multiGet({"y", "log", "x"});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(S(got[0]), "2");
  EXPECT_EQ(S(got[1]), "ab");
  EXPECT_EQ(S(got[2]), "1");
}

TEST_F(TorchClientOnOurServerTest, AddCountsOnFromTheLeadingNumber) {
  c10d::TCPStore store("127.0.0.1", ClientOpts(server_->port()));
  store.set("c", B(" 7abc"));
  EXPECT_EQ(store.add("c", 1), 8);
  EXPECT_EQ(S(store.get("c")), "8");
}
#else
// WATCH_KEY exists in 1.13 only (2.x's watchKey throws, unimplemented).
TEST_F(TorchClientOnOurServerTest, WatchKeySeesCreateUpdateDelete) {
  c10d::TCPStore store("127.0.0.1", ClientOpts(server_->port()));
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> seen;
  store.watchKey("w", [&](c10::optional<std::string> old_v,
                          c10::optional<std::string> new_v) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(old_v.value_or("<none>") + "->" + new_v.value_or("<none>"));
    cv.notify_all();
  });
  store.set("w", B("1"));
  store.set("w", B("2"));
  store.deleteKey("w");
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(2),
                          [&] { return seen.size() >= 3; }));
  EXPECT_EQ(seen[0], "<none>->1");
  EXPECT_EQ(seen[1], "1->2");
  EXPECT_EQ(seen[2], "2-><none>");
}
#endif

TEST_F(TorchClientOnOurServerTest, ManyTorchClientsCountThemselvesInInit) {
  std::vector<std::unique_ptr<c10d::TCPStore>> clients;
  for (int i = 0; i < 8; ++i) {
    clients.push_back(std::make_unique<c10d::TCPStore>(
        "127.0.0.1", ClientOpts(server_->port(), 8)));
  }
  StoreClientOptions opts;
  opts.port = server_->port();
  auto ours = TcpStoreClient::Connect(opts);
  ASSERT_TRUE(ours.ok());
  EXPECT_EQ(*(*ours)->Add("init/", 0), 8);
}

class OurClientOnTorchServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c10d::TCPStoreOptions opts;
    opts.port = 0;
    opts.isServer = true;
    opts.waitWorkers = false;
    opts.timeout = milliseconds(5000);
#if TORCH_VERSION_MAJOR >= 2
    opts.useLibUV = false;
#endif
    server_ = std::make_unique<c10d::TCPStore>("127.0.0.1", opts);
    StoreClientOptions copts;
    copts.port = server_->getPort();
    copts.dialect = kTorchDialect;
    copts.timeout = milliseconds(3000);
    auto client = TcpStoreClient::Connect(copts);
    ASSERT_TRUE(client.ok()) << client.status().message();
    client_ = std::move(*client);
  }
  std::unique_ptr<c10d::TCPStore> server_;
  std::unique_ptr<TcpStoreClient> client_;
};

TEST_F(OurClientOnTorchServerTest, EveryOperationInterops) {
  ASSERT_TRUE(client_->Set("k", "v").ok());
  EXPECT_EQ(S(server_->get("k")), "v");  // libtorch sees our key as its own
  server_->set("theirs", B("t"));
  EXPECT_EQ(*client_->Get("theirs"), "t");
  EXPECT_EQ(*client_->Add("n", 4), 4);
  EXPECT_EQ(server_->add("n", 1), 5);
  EXPECT_EQ(*client_->CompareSet("k", "v", "w"), "w");
  EXPECT_EQ(*client_->CompareSet("k", "v", "z"), "w");
  EXPECT_EQ(*client_->CompareSet("fresh", "", "x"), "x");
  EXPECT_TRUE(*client_->Check({"k", "n"}));
  EXPECT_FALSE(*client_->Check({"nope"}));
  EXPECT_TRUE(client_->Wait({"k", "theirs"}, milliseconds(500)).ok());
#if TORCH_VERSION_MAJOR >= 2
  ASSERT_TRUE(client_->Append("log", "a").ok());
  ASSERT_TRUE(client_->Append("log", "b").ok());
  // APPEND has no reply: read back on the same connection, which orders it.
  EXPECT_EQ(*client_->Get("log"), "ab");
#endif
  EXPECT_EQ(*client_->NumKeys(), server_->getNumKeys());
  EXPECT_TRUE(*client_->DeleteKey("k"));
  EXPECT_FALSE(server_->check({"k"}));
}

TEST_F(OurClientOnTorchServerTest, WaitTimeoutDoesNotDesyncLaterReplies) {
  Status s = client_->Wait({"later"}, milliseconds(100));
  EXPECT_EQ(s.code(), Status::Code::kTimeout);
  // 1.13: libtorch's server keeps the registration and answers it when the
  // key appears; our client reconnected, so the stray byte goes nowhere.
  // 2.x: our client canceled the wait (CANCEL_WAIT) on the same connection.
  server_->set("later", B("1"));
  EXPECT_EQ(*client_->Add("after", 7), 7);
  EXPECT_EQ(*client_->Get("later"), "1");
}

}  // namespace
}  // namespace dtrun::rendezvous
