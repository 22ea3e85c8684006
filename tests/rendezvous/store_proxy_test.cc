// A node's store proxy between our clients (both dialects) and our server,
// over real loopback sockets: every operation through it, waits released
// across nodes, a worker's close seen by the store, bad input from a
// worker or on the multiplexed connection, the store lost, and stores that
// take no proxies.
#include "rendezvous/store_proxy.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "rendezvous/store_client.h"
#include "rendezvous/store_mux.h"
#include "rendezvous/store_server.h"
#include "rendezvous/util/log.h"
#include "tests/testing/dialect_param.h"
#include "tests/testing/log_capture.h"
#include "tests/testing/raw_conn.h"

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;
using testing::RawConn;

class StoreProxyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreServerOptions opts;
    opts.host = "127.0.0.1";
    auto server = StoreServer::Start(opts);
    ASSERT_TRUE(server.ok()) << server.status().message();
    server_ = std::move(*server);
    server_->RunInBackground();
  }
  void TearDown() override {
    proxies_.clear();
    if (server_) server_->Stop();
  }

  // A proxy of its own loop in front of the server; its port.
  uint16_t Proxy() {
    StoreProxyOptions o;
    o.upstream_host = "127.0.0.1";
    o.upstream_port = server_->port();
    o.connect_timeout = milliseconds(5000);
    auto p = StoreProxy::Start(o);
    EXPECT_TRUE(p.ok()) << p.status().message();
    if (!p.ok()) return 0;
    (*p)->RunInBackground();
    proxies_.push_back(std::move(*p));
    return proxies_.back()->port();
  }

  std::unique_ptr<TcpStoreClient> Client(uint16_t port,
                                         Dialect d = Dialect::kTorch2) {
    StoreClientOptions opts;
    opts.port = port;
    opts.dialect = d;
    opts.timeout = milliseconds(3000);
    opts.connect_timeout = milliseconds(3000);
    auto client = TcpStoreClient::Connect(opts);
    EXPECT_TRUE(client.ok()) << client.status().message();
    return client.ok() ? std::move(*client) : nullptr;
  }

  std::string Log() { return log_.Text(); }

  std::unique_ptr<StoreServer> server_;
  std::vector<std::unique_ptr<StoreProxy>> proxies_;
  testing::ScopedLogCapture log_{"dtrun.store"};
};

class StoreProxyDialectTest : public StoreProxyTest,
                              public ::testing::WithParamInterface<Dialect> {};

TEST_P(StoreProxyDialectTest, EveryOperationPassesThrough) {
  auto c = Client(Proxy(), GetParam());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->Set("k", "v").ok());
  EXPECT_EQ(*c->Get("k"), "v");
  EXPECT_EQ(*c->Add("n", 5), 5);
  EXPECT_EQ(*c->CompareSet("k", "v", "w"), "w");
  EXPECT_TRUE(*c->Check({"k", "n"}));
  EXPECT_FALSE(*c->Check({"k", "missing"}));
  EXPECT_EQ(*c->NumKeys(), 2);
  EXPECT_TRUE(*c->DeleteKey("k"));
  Status s = c->Wait({"never"}, milliseconds(50));
  EXPECT_EQ(s.code(), Status::Code::kTimeout);
  EXPECT_EQ(*c->Add("n", 1), 6);  // still in step after the timeout
  // A value of 900 KiB, every byte kept, in pieces both ways.
  std::string big(900 * 1024, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(c->Set("big", big).ok());
  auto direct = Client(server_->port(), GetParam());
  EXPECT_EQ(*direct->Get("big"), big);
  EXPECT_EQ(*c->Get("big"), big);
}

INSTANTIATE_TEST_SUITE_P(BothDialects, StoreProxyDialectTest,
                         testing::BothDialects(), testing::DialectName);

// Eight workers on each of two nodes: every one SETs its address and waits
// for rank 0's; all released, each store connection one per node.
TEST_F(StoreProxyTest, WaitsAcrossNodesAreReleasedAndTheStoreSeesNodes) {
  uint16_t node[2] = {Proxy(), Proxy()};
  std::vector<std::unique_ptr<TcpStoreClient>> ws;
  for (int i = 0; i < 16; ++i) ws.push_back(Client(node[i / 8]));
  std::vector<std::thread> ts;
  std::atomic<int> released{0};
  for (int i = 1; i < 16; ++i) {
    ts.emplace_back([&, i] {
      ws[i]->Set("addr/" + std::to_string(i), "x");
      if (ws[i]->Wait({"uid"}, milliseconds(3000)).ok() &&
          *ws[i]->Get("uid") == "id0")
        ++released;
    });
  }
  std::this_thread::sleep_for(milliseconds(50));
  ws[0]->Set("uid", "id0");
  for (auto& t : ts) t.join();
  EXPECT_EQ(released, 15);
  EXPECT_EQ(proxies_[0]->GetCounts().workers, 8u);
  EXPECT_EQ(proxies_[1]->GetCounts().accepted, 8u);
  // The server: two proxy connections and their sixteen streams.
  EXPECT_EQ(server_->NumConnections(), 18u);
  ws.clear();
  for (int i = 0; i < 200 && server_->NumConnections() > 2; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(server_->NumConnections(), 2u);
}

// The store learns a worker's close (its on-close ADD runs), as for a
// connection of its own.
TEST_F(StoreProxyTest, AWorkersCloseReachesTheStore) {
  auto c = Client(Proxy());
  auto w = Client(server_->port());
  ASSERT_TRUE(c->BindOnClose("gone", "bound").ok());
  EXPECT_FALSE(*c->Check({"bound"}));  // a round trip: the binding is in
  c.reset();
  EXPECT_TRUE(w->Wait({"gone"}, milliseconds(2000)).ok());
}

TEST_F(StoreProxyTest, AMalformedRequestClosesOnlyThatWorker) {
  uint16_t port = Proxy();
  auto good = Client(port);
  good->Set("kept", "1");
  RawConn bad(port);
  bad.Send(std::string(1, '\x2a'));
  EXPECT_TRUE(bad.ClosedByPeer());
  EXPECT_EQ(*good->Get("kept"), "1");
  EXPECT_NE(Log().find("unknown opcode 42"), std::string::npos);
  EXPECT_NE(Log().find("stream"), std::string::npos);
  auto again = Client(port);
  EXPECT_EQ(*again->Add("n", 1), 1);
}

// Garbage after the hello: the store closes that proxy's connection alone.
TEST_F(StoreProxyTest, AMalformedFrameClosesOnlyThatProxy) {
  auto good = Client(Proxy());
  RawConn bad(server_->port());
  bad.Send(std::string(kMuxHello));
  EXPECT_EQ(bad.Read(kMuxHello.size()), std::string(kMuxHello));
  std::string frame;
  PutMuxHeader(&frame, MuxType::kOpen, 1, 0);
  frame[0] = 9;
  bad.Send(frame);
  EXPECT_TRUE(bad.ClosedByPeer());
  EXPECT_NE(Log().find("malformed proxy frame: unknown frame type 9"),
            std::string::npos);
  EXPECT_EQ(*good->Add("n", 2), 2);
}

TEST_F(StoreProxyTest, LosingTheStoreClosesTheNodesWorkers) {
  uint16_t port = Proxy();
  RawConn worker(port);
  auto c = Client(port);
  ASSERT_TRUE(c->Set("k", "v").ok());
  server_->Stop();
  EXPECT_TRUE(worker.ClosedByPeer(milliseconds(3000)));
  for (int i = 0; i < 100 && !proxies_[0]->GetCounts().upstream_lost; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_TRUE(proxies_[0]->GetCounts().upstream_lost);
  EXPECT_NE(Log().find("lost the workers' store at 127.0.0.1:"),
            std::string::npos);
  RawConn late(port);  // the listener is closed too
  EXPECT_FALSE(late.ok() && !late.ClosedByPeer(milliseconds(500)));
}

// A listener that reads the hello and closes, as a store of an older dtrun
// (a malformed first byte) does.
TEST(StoreProxyStartTest, AStoreThatTakesNoProxiesIsNamed) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ::listen(fd, 4);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread old([fd] {
    int c = ::accept(fd, nullptr, nullptr);
    char buf[8];
    ::recv(c, buf, sizeof(buf), 0);
    ::close(c);
  });
  StoreProxyOptions o;
  o.upstream_host = "127.0.0.1";
  o.upstream_port = ntohs(a.sin_port);
  o.connect_timeout = milliseconds(2000);
  auto p = StoreProxy::Start(o);
  old.join();
  ::close(fd);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("takes no proxies"), std::string::npos)
      << p.status().message();
  EXPECT_NE(p.status().message().find("127.0.0.1:" +
                                      std::to_string(ntohs(a.sin_port))),
            std::string::npos);
}

TEST(StoreProxyStartTest, NothingListeningIsNamed) {
  StoreProxyOptions o;
  o.upstream_host = "127.0.0.1";
  o.upstream_port = 1;  // nothing listens on port 1 here
  o.connect_timeout = milliseconds(1000);
  auto p = StoreProxy::Start(o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("the workers' store at 127.0.0.1:1"),
            std::string::npos)
      << p.status().message();
}

}  // namespace
}  // namespace dtrun::rendezvous
