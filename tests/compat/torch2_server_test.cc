// Our client (the host build's TcpStoreClient, >= 2.2 dialect) against
// torch 2.6's own TCPStore server, started in the trixie root by
// tests/compat/torch_store_server.py through scripts/torch2.sh. No libtorch
// here: the peer is a separate process.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "rendezvous/rendezvous.h"
#include "rendezvous/store_client.h"
#include "tests/testing/raw_conn.h"

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;

// torch 2.6's server process: its stdin is a pipe from us, so it exits when
// we close it (or die). Stopped by pid.
class Torch2Server {
 public:
  // Starts it and reads its "listening on HOST:PORT" line; on failure
  // *error says why and what to do.
  bool Start(std::string* error) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      *error = "pipe failed";
      return false;
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      const std::string sh =
          std::string(DTRUN_SOURCE_DIR) + "/scripts/torch2.sh";
      const std::string py =
          std::string(DTRUN_SOURCE_DIR) + "/tests/compat/torch_store_server.py";
      // The root sees the checkout at the same path; run from inside it.
      if (::chdir(DTRUN_SOURCE_DIR) == 0) {
        ::execl(sh.c_str(), sh.c_str(), "run", "/usr/bin/python3", py.c_str(),
                static_cast<char*>(nullptr));
      }
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
    std::string line = ReadLine(std::chrono::seconds(90));
    if (line.rfind("listening on ", 0) != 0) {
      *error = "torch 2.6's server did not start (got '" + line +
               "'); compat2 tests need the torch 2.6 root: make it with "
               "scripts/torch2.sh (as root), see its error above";
      return false;
    }
    port_ = static_cast<uint16_t>(std::stoi(line.substr(line.rfind(':') + 1)));
    return true;
  }

  ~Torch2Server() {
    if (stdin_ >= 0) ::close(stdin_);
    if (stdout_ >= 0) ::close(stdout_);
    if (pid_ <= 0) return;
    for (int i = 0; i < 100; ++i) {  // 5 s to exit on its own
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  uint16_t port() const { return port_; }

 private:
  std::string ReadLine(std::chrono::seconds timeout) {
    std::string line;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    char c = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{stdout_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      if (::read(stdout_, &c, 1) != 1 || c == '\n') break;
      line.push_back(c);
    }
    return line;
  }

  pid_t pid_ = -1;
  int stdin_ = -1, stdout_ = -1;
  uint16_t port_ = 0;
};

class OurClientOnTorch2ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new Torch2Server;
    server_->Start(&start_error_);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(start_error_.empty()) << start_error_;
    client_ = Connect();
  }
  std::unique_ptr<TcpStoreClient> Connect(
      milliseconds timeout = milliseconds(3000)) {
    StoreClientOptions opts;
    opts.port = server_->port();
    opts.timeout = timeout;
    opts.connect_timeout = milliseconds(5000);
    auto client = TcpStoreClient::Connect(opts);
    EXPECT_TRUE(client.ok()) << client.status().message();
    return client.ok() ? std::move(*client) : nullptr;
  }
  // A key private to the running test: the server lives for the suite.
  static std::string Key(const std::string& name) {
    return std::string(::testing::UnitTest::GetInstance()
                           ->current_test_info()
                           ->name()) +
           "/" + name;
  }

  static Torch2Server* server_;
  static std::string start_error_;
  std::unique_ptr<TcpStoreClient> client_;
};

Torch2Server* OurClientOnTorch2ServerTest::server_ = nullptr;
std::string OurClientOnTorch2ServerTest::start_error_;

TEST_F(OurClientOnTorch2ServerTest, EveryOperationInterops) {
  const std::string k = Key("k"), n = Key("n"), fresh = Key("fresh");
  int64_t before = *client_->NumKeys();
  ASSERT_TRUE(client_->Set(k, "v").ok());
  EXPECT_EQ(*Connect()->Get(k), "v");
  EXPECT_EQ(*client_->Add(n, 4), 4);
  EXPECT_EQ(*client_->Add(n, -1), 3);
  EXPECT_EQ(*client_->Get(n), "3");
  EXPECT_EQ(*client_->CompareSet(k, "v", "w"), "w");
  EXPECT_EQ(*client_->CompareSet(k, "v", "z"), "w");
  EXPECT_EQ(*client_->CompareSet(fresh, "", "x"), "x");
  EXPECT_EQ(*client_->CompareSet(Key("absent"), "e", "x"), "e");
  EXPECT_TRUE(*client_->Check({k, n}));
  EXPECT_FALSE(*client_->Check({k, Key("absent")}));
  EXPECT_TRUE(client_->Wait({k, fresh}, milliseconds(500)).ok());
  ASSERT_TRUE(client_->Append(Key("log"), "a").ok());
  ASSERT_TRUE(client_->Append(Key("log"), "b").ok());
  EXPECT_EQ(*client_->Get(Key("log")), "ab");
  EXPECT_EQ(*client_->NumKeys(), before + 4);
  EXPECT_TRUE(*client_->DeleteKey(k));
  EXPECT_FALSE(*client_->DeleteKey(k));
  EXPECT_FALSE(*client_->Check({k}));
}

TEST_F(OurClientOnTorch2ServerTest, KeysCarryTorchsSlashPrefix) {
  ASSERT_TRUE(client_->Set(Key("k"), "v").ok());
  testing::RawConn raw(server_->port());
  const std::string key = "/" + Key("k");
  std::string get("\x00\xce\xf7\x85\x3c\x03", 6);
  PutU64(&get, key.size());
  get += key;
  ASSERT_TRUE(raw.Send(get));
  std::string expected;
  PutBytes(&expected, "v");
  EXPECT_EQ(raw.Read(expected.size()), expected);
}

TEST_F(OurClientOnTorch2ServerTest, AddCountsOnFromTheLeadingNumber) {
  ASSERT_TRUE(client_->Set(Key("c"), " 7abc").ok());
  EXPECT_EQ(*client_->Add(Key("c"), 1), 8);
}

TEST_F(OurClientOnTorch2ServerTest, WaitReleasedByAnotherClient) {
  auto setter = Connect();
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE(setter->Set(Key("late"), "1").ok());
  });
  EXPECT_TRUE(client_->Wait({Key("late")}, milliseconds(3000)).ok());
  t.join();
}

TEST_F(OurClientOnTorch2ServerTest,
       WaitTimeoutCancelsAndLaterRepliesStayInStep) {
  auto start = std::chrono::steady_clock::now();
  Status s = client_->Wait({Key("later")}, milliseconds(200));
  EXPECT_EQ(s.code(), Status::Code::kTimeout) << s.message();
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(150));
  ASSERT_TRUE(Connect()->Set(Key("later"), "1").ok());
  EXPECT_EQ(*client_->Add(Key("after"), 7), 7);
  EXPECT_EQ(*client_->Get(Key("later")), "1");
}

TEST_F(OurClientOnTorch2ServerTest, LargeValueRoundTrips) {
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  ASSERT_TRUE(client_->Set(Key("big"), big).ok());
  EXPECT_EQ(*Connect()->Get(Key("big")), big);
}

TEST_F(OurClientOnTorch2ServerTest,
       BarrierFailsFastOnA26ServerThenClientRecovers) {
  // 2.6's server has no BARRIER (opcode 18): it drops the connection, and
  // the error says so (closed or reset) instead of waiting out the timeout.
  auto start = std::chrono::steady_clock::now();
  Status s = client_->Barrier(Key("b"), 1, milliseconds(3000));
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.message();
  EXPECT_NE(s.message().find("barrier on"), std::string::npos) << s.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
  EXPECT_EQ(*client_->Add(Key("n"), 2), 2);  // reconnected
}

// 2.6's server answers MULTI_GET only when every key exists: it drops the
// connection on a missing one. The client reads that call again key by
// key, and from then on, losing nothing.
TEST_F(OurClientOnTorch2ServerTest, MultiGetOfAMissingKeyGoesKeyByKey) {
  auto fresh = Connect();
  ASSERT_TRUE(fresh->MultiSet({Key("x"), Key("y")}, {"1", "2"}).ok());
  EXPECT_EQ(*fresh->MultiGet({Key("x"), Key("y")}),
            (std::vector<std::string>{"1", "2"}));
  auto mixed = fresh->MultiGet({Key("x"), Key("absent"), Key("y")});
  ASSERT_TRUE(mixed.ok()) << mixed.status().message();
  EXPECT_EQ(*mixed, (std::vector<std::string>{"1", "", "2"}));
  EXPECT_EQ(*fresh->MultiGet({Key("absent"), Key("x")}),
            (std::vector<std::string>{"", "1"}));
}

TEST_F(OurClientOnTorch2ServerTest, MultiGetAndMultiSetGoKeyByKeyWhereMissing) {
  ASSERT_TRUE(
      client_->MultiSet({Key("a"), Key("b")}, {"1", std::string("2\0", 2)})
          .ok());
  auto got = client_->MultiGet({Key("a"), Key("missing"), Key("b")});
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, (std::vector<std::string>{"1", "", std::string("2\0", 2)}));
  EXPECT_EQ(*Connect()->MultiGet({Key("b")}),
            std::vector<std::string>{std::string("2\0", 2)});
}

// A rendezvous joiner's entry: this server answers dtrun's enlist key with
// the counter's name and stores nothing, so the client takes the slot and
// writes the record in two requests, and slots stay dense.
TEST_F(OurClientOnTorch2ServerTest, ARendezvousEntryTakesTwoRequestsHere) {
  Store::Enlistment e;
  e.counter = Key("n");
  e.records = Key("node/");
  e.id = "a";
  e.record = "rec a";
  e.closes = Key("gone/");
  auto other = Connect();
  auto first = client_->Enlist(e);
  ASSERT_TRUE(first.ok()) << first.status().message();
  e.record = "rec b";
  auto second = other->Enlist(e);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(first->slot, 1);
  EXPECT_EQ(second->slot, 2);
  EXPECT_FALSE(first->bound);  // no binding here: heartbeats tell
  auto records = client_->ReadEnlisted(Key("node/"), 2, milliseconds(2000));
  ASSERT_TRUE(records.ok()) << records.status().message();
  EXPECT_EQ(*records, (std::vector<std::string>{"rec a", "rec b"}));
  EXPECT_FALSE(*client_->Check({"dtrun/.enlist"}));
}

// Two nodes meet in a round on torch's own store: the entry in two
// requests, the outcome's read key by key, and `final` set again so that
// the waiter wakes (this server wakes none on a compare-and-set) well
// within its 2 s wait.
TEST_F(OurClientOnTorch2ServerTest, TwoNodesMeetOnTorchsOwnStore) {
  auto store_a = Connect(), store_b = Connect();
  ASSERT_TRUE(store_a && store_b);
  auto options = [](const std::string& id) {
    RendezvousOptions o;
    o.run_id = Key("job");
    o.node_id = id;
    o.min_nodes = o.max_nodes = 2;
    o.join_timeout = std::chrono::seconds(20);
    return o;
  };
  Rendezvous a(store_a.get(), options("a")), b(store_b.get(), options("b"));
  const auto start = std::chrono::steady_clock::now();
  auto fa = std::async(std::launch::async, [&] { return a.Join(nullptr); });
  std::this_thread::sleep_for(milliseconds(100));
  auto rb = b.Join(nullptr);
  auto ra = fa.get();
  ASSERT_TRUE(ra.ok()) << ra.status().message();
  ASSERT_TRUE(rb.ok()) << rb.status().message();
  EXPECT_EQ(ra->group_rank + rb->group_rank, 1);
  EXPECT_EQ(ra->group_world_size, 2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
}

TEST_F(OurClientOnTorch2ServerTest, ConcurrentClientsCountEveryAdd) {
  const std::string n = Key("n");
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([this, &n] {
      auto c = Connect();
      for (int j = 0; j < 20; ++j) EXPECT_TRUE(c->Add(n, 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*client_->Get(n), "160");
}

}  // namespace
}  // namespace dtrun::rendezvous
