// EtcdStore and EtcdWatch against a real etcd member this test starts on
// 127.0.0.2, and EtcdClient against members that are down and servers that
// answer garbage.
#include "rendezvous/etcd_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;

// A port free on `host` now.
uint16_t FreePort(const char* host) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, host, &a.sin_addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class EtcdStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir[] = "/tmp/dtrun-etcd-store-test-XXXXXX";
    data_dir_ = mkdtemp(dir);
    const std::string host = "127.0.0.2";
    endpoint_ = host + ":" + std::to_string(FreePort(host.c_str()));
    const std::string peer =
        "http://" + host + ":" + std::to_string(FreePort(host.c_str()));
    const std::string client = "http://" + endpoint_;
    pid_ = fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      execlp("etcd", "etcd", "--name", "m0", "--data-dir", data_dir_.c_str(),
             "--listen-client-urls", client.c_str(), "--advertise-client-urls",
             client.c_str(), "--listen-peer-urls", peer.c_str(),
             "--initial-advertise-peer-urls", peer.c_str(), "--initial-cluster",
             ("m0=" + peer).c_str(), "--log-level", "error", "--logger", "zap",
             nullptr);
      _exit(127);
    }
  }

  static void TearDownTestSuite() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::system(("rm -rf " + data_dir_).c_str());
  }

  // A store on the member, with keys of this test under their own prefix.
  std::unique_ptr<EtcdStore> Open(std::vector<std::string> endpoints = {}) {
    EtcdOptions o;
    o.endpoints =
        endpoints.empty() ? std::vector<std::string>{endpoint_} : endpoints;
    o.timeout = milliseconds(20000);  // the member's first start included
    auto c = EtcdClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().message();
    if (!c.ok()) return nullptr;
    (*c)->set_timeout(milliseconds(3000));
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::make_unique<EtcdStore>(
        std::move(*c), std::string("/test/") + info->name() + "/",
        milliseconds(3000));
  }

  static inline pid_t pid_ = -1;
  static inline std::string data_dir_;
  static inline std::string endpoint_;
};

TEST_F(EtcdStoreTest, BehavesLikeTheTcpStore) {
  auto s = Open();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->Set("a", std::string("x\0y", 3)).ok());
  EXPECT_EQ(*s->Get("a"), std::string("x\0y", 3));
  EXPECT_EQ(*s->Add("n", 0), 0);
  EXPECT_EQ(*s->Add("n", 1), 1);
  EXPECT_EQ(*s->Add("n", 2), 3);
  EXPECT_EQ(*s->Add("n", 0), 3);
  EXPECT_FALSE(s->Add("n", -1).ok());
  // compare-and-set, c10d's answers included
  EXPECT_EQ(*s->CompareSet("c", "", "one"), "one");
  EXPECT_EQ(*s->CompareSet("c", "", "two"), "one");
  EXPECT_EQ(*s->CompareSet("c", "zero", "two"), "one");
  EXPECT_EQ(*s->CompareSet("c", "one", "two"), "two");
  EXPECT_EQ(*s->CompareSet("missing", "old", "new"), "old");
  EXPECT_TRUE(*s->Check({"a", "c"}));
  EXPECT_FALSE(*s->Check({"a", "nope"}));
  auto got = s->MultiGet({"a", "nope", "c"});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[1], "");
  EXPECT_EQ((*got)[2], "two");
  EXPECT_TRUE(*s->DeleteKey("c"));
  EXPECT_FALSE(*s->DeleteKey("c"));
  EXPECT_EQ(*s->NumKeys(), 2);  // a, n
  auto t0 = std::chrono::steady_clock::now();
  Status w = s->Wait({"never"}, milliseconds(300));
  EXPECT_EQ(w.code(), Status::Code::kTimeout) << w.message();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(300));
}

// A joiner's entry is one transaction; the closer reads the records in the
// slots' order, whichever client wrote them.
TEST_F(EtcdStoreTest, EnlistTakesSlotsAndRecordsReadInTheirOrder) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  std::vector<std::string> want;
  for (int i = 0; i < 6; ++i) {
    Store::Enlistment e;
    e.counter = "r/n";
    e.records = "r/node/";
    e.id = "id" + std::to_string(9 - i);
    e.record = "rec" + std::to_string(i);
    auto got = (i % 2 ? b : a)->Enlist(e);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(got->slot, i + 1);
    EXPECT_FALSE(got->bound);
    want.push_back(e.record);
  }
  EXPECT_EQ(*a->Add("r/n", 0), 6);
  auto records = a->ReadEnlisted("r/node/", 4, milliseconds(0));
  ASSERT_TRUE(records.ok()) << records.status().message();
  EXPECT_EQ(*records, std::vector<std::string>(want.begin(), want.begin() + 4));
  auto more = b->ReadEnlisted("r/node/", 8, milliseconds(0));
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(more->size(), 8u);
  EXPECT_EQ((*more)[5], "rec5");
  EXPECT_EQ((*more)[6], "");
  // The lease's key in the same transaction: the store tells when it is gone.
  Store::Enlistment e;
  e.counter = "r/n";
  e.records = "r/node/";
  e.id = "leased";
  e.record = "rec6";
  e.alive = "r/alive/";
  e.alive_ttl = milliseconds(3000);
  auto got = a->Enlist(e);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->slot, 7);
  EXPECT_TRUE(got->bound);
  EXPECT_EQ(*b->Get("r/alive/leased"), "1");
  ASSERT_TRUE(a->LeaseKey("", milliseconds(0)).ok());  // leaves on purpose
  EXPECT_EQ(*b->Get("r/alive/leased"), "left");
}

TEST_F(EtcdStoreTest, MultiSetAndMultiGetSplitPastTheTransactionLimit) {
  auto s = Open();
  ASSERT_TRUE(s);
  std::vector<std::string> keys, values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("k" + std::to_string(i));
    values.push_back(std::to_string(i * i));
  }
  ASSERT_TRUE(s->MultiSet(keys, values).ok());
  auto got = s->MultiGet(keys);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, values);
  EXPECT_EQ(*s->DeletePrefix("k"), 300);
}

TEST_F(EtcdStoreTest, ConcurrentAddsEachGetTheirOwnCount) {
  std::vector<std::unique_ptr<EtcdStore>> stores;
  for (int t = 0; t < 8; ++t) stores.push_back(Open());
  std::vector<std::vector<int64_t>> seen(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i)
        seen[t].push_back(*stores[t]->Add("slot", 1));
    });
  }
  for (auto& t : threads) t.join();
  std::set<int64_t> all;
  for (auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), 200u);
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), 200);
  EXPECT_EQ(*stores[0]->Add("slot", 0), 200);
}

TEST_F(EtcdStoreTest, GetAndWaitWakeWhenAnotherClientSets) {
  auto s = Open();
  auto other = Open();
  ASSERT_TRUE(s && other);
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(200));
    other->Set("late", "here");
  });
  auto t0 = std::chrono::steady_clock::now();
  auto got = s->Get("late");
  later.join();
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, "here");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2000));
}

// A round's closer waits for every joiner's record: the keys come in any
// order while it waits, some are there before it starts, and the wait ends
// with the last one (one watch of their range, not a read per arrival).
TEST_F(EtcdStoreTest, WaitForManyKeysEndsWithTheLastToCome) {
  auto s = Open();
  auto other = Open();
  ASSERT_TRUE(s && other);
  std::vector<std::string> keys;
  for (int i = 1; i <= 300; ++i) keys.push_back("node/" + std::to_string(i));
  for (int i = 0; i < 300; i += 3) ASSERT_TRUE(s->Set(keys[i], "early").ok());
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(100));
    for (int i = 299; i >= 0; --i) {
      if (i % 3 != 0) other->Set(keys[i], "late");
    }
  });
  Status waited = s->Wait(keys, milliseconds(20000));
  // Read before the writer is joined: every key must be there already.
  auto got = s->MultiGet(keys);
  later.join();
  ASSERT_TRUE(waited.ok()) << waited.message();
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < keys.size(); ++i)
    EXPECT_FALSE((*got)[i].empty()) << keys[i] << " missing after the wait";
  // One never comes: the timeout names it.
  keys.push_back("node/never");
  Status missing = s->Wait(keys, milliseconds(300));
  EXPECT_EQ(missing.code(), Status::Code::kTimeout);
  EXPECT_NE(missing.message().find("node/never"), std::string::npos)
      << missing.message();
}

TEST_F(EtcdStoreTest, WatchPushesChangesInOrder) {
  auto s = Open();
  ASSERT_TRUE(s);
  auto watch = s->OpenWatch();
  ASSERT_TRUE(watch->WatchKey("w").ok());
  ASSERT_TRUE(s->Set("w", "1").ok());
  ASSERT_TRUE(s->Set("w", "2").ok());
  ASSERT_TRUE(s->DeleteKey("w").ok());
  ASSERT_TRUE(s->Set("other", "x").ok());  // not watched
  std::vector<KeyChange> changes;
  auto until = std::chrono::steady_clock::now() + milliseconds(3000);
  while (changes.size() < 3 && std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(watch->TakeChanges(&changes).ok());
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].key, "w");
  EXPECT_EQ(changes[0].kind, KeyChange::Kind::kCreated);
  EXPECT_EQ(changes[0].value, "1");
  EXPECT_EQ(changes[1].kind, KeyChange::Kind::kUpdated);
  EXPECT_EQ(changes[1].value, "2");
  EXPECT_EQ(changes[2].kind, KeyChange::Kind::kDeleted);
}

// Reads `key` through another client until it is gone; how long that took
// (or `limit` when it stayed).
milliseconds UntilGone(EtcdStore* s, const std::string& key, milliseconds limit,
                       const std::function<void()>& meanwhile = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const auto took = std::chrono::duration_cast<milliseconds>(
        std::chrono::steady_clock::now() - t0);
    if (took >= limit) return limit;
    auto got = s->MultiGet({key});
    if (got.ok() && (*got)[0].empty()) return took;
    if (meanwhile) meanwhile();
    std::this_thread::sleep_for(milliseconds(50));
  }
}

// A leased key lives while its holder says it is alive (three TTLs here),
// and goes about a TTL after the holder falls silent; the deletion is
// pushed to a watcher.
TEST_F(EtcdStoreTest, ALeasedKeyLivesWhileItsHolderDoes) {
  auto holder = Open(), reader = Open();
  ASSERT_TRUE(holder && reader);
  auto watch = reader->OpenWatch();
  ASSERT_TRUE(watch->WatchKey("alive").ok());
  ASSERT_TRUE(holder->LeaseKey("alive", milliseconds(1000)).ok());
  // etcd grants at least 2 s with its default timings.
  EXPECT_EQ(UntilGone(reader.get(), "alive", milliseconds(6000),
                      [&] { holder->StillAlive(); }),
            milliseconds(6000));
  const milliseconds gone =
      UntilGone(reader.get(), "alive", milliseconds(8000));
  EXPECT_LT(gone, milliseconds(8000)) << "the key outlived its silent holder";
  EXPECT_GE(gone, milliseconds(1000));
  std::vector<KeyChange> changes;
  ASSERT_TRUE(watch->TakeChanges(&changes).ok());
  ASSERT_FALSE(changes.empty());
  EXPECT_EQ(changes.back().kind, KeyChange::Kind::kDeleted);
  // A lapsed lease is granted again at the next key.
  ASSERT_TRUE(holder->LeaseKey("again", milliseconds(1000)).ok());
  EXPECT_EQ(*reader->Get("again"), "1");
}

// A detached key stays ("left"); the store going revokes its lease, and a
// key still under it goes at once.
TEST_F(EtcdStoreTest, ADetachedKeyStaysAndTheStoreGoingRevokes) {
  auto holder = Open(), reader = Open();
  ASSERT_TRUE(holder && reader);
  ASSERT_TRUE(holder->LeaseKey("round0", milliseconds(30000)).ok());
  ASSERT_TRUE(holder->LeaseKey("round1", milliseconds(30000)).ok());
  ASSERT_TRUE(holder->LeaseKey("", milliseconds(0)).ok());  // detaches round1
  holder.reset();
  EXPECT_LT(UntilGone(reader.get(), "round0", milliseconds(3000)),
            milliseconds(3000));
  EXPECT_EQ(*reader->Get("round1"), "left");
}

TEST_F(EtcdStoreTest, AMemberThatIsDownIsPassedOver) {
  const std::string down = "127.0.0.3:" + std::to_string(FreePort("127.0.0.3"));
  // Clients start at a member of their choosing: several, so that some
  // start at the one that is down.
  for (int i = 0; i < 8; ++i) {
    auto s = Open({down, endpoint_});
    ASSERT_TRUE(s);
    EXPECT_TRUE(s->Set("k", "v").ok());
    EXPECT_EQ(s->client()->endpoint(), endpoint_);
  }
}

TEST(EtcdClientTest, NoMemberUpNamesEachEndpoint) {
  EtcdOptions o;
  o.endpoints = {"127.0.0.3:" + std::to_string(FreePort("127.0.0.3")),
                 "127.0.0.4:" + std::to_string(FreePort("127.0.0.4"))};
  o.timeout = milliseconds(500);
  auto c = EtcdClient::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Status::Code::kUnavailable);
  EXPECT_NE(c.status().message().find("no etcd member reachable"),
            std::string::npos)
      << c.status().message();
  for (const auto& e : o.endpoints)
    EXPECT_NE(c.status().message().find(e), std::string::npos);
}

TEST(EtcdClientTest, BadOptionsAreNamed) {
  EtcdOptions o;
  o.endpoints = {"nohost"};
  auto c = EtcdClient::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Status::Code::kInvalid);
  EXPECT_NE(c.status().message().find("'nohost' is not HOST:PORT"),
            std::string::npos);
  o.endpoints = {"127.0.0.1:2379"};
  o.tls = true;
  o.cacert = "/nonexistent/ca.pem";
  c = EtcdClient::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cacert=/nonexistent/ca.pem"),
            std::string::npos);
}

// A server that accepts connections and answers each with `reply` (then
// closes), for the client's handling of malformed replies.
class GarbageServer {
 public:
  // `keep_open`: after the reply the connection stays open (a server that
  // says it will send more), so only the client's own bounds end the wait.
  explicit GarbageServer(std::string reply, bool keep_open = false)
      : reply_(std::move(reply)), keep_open_(keep_open) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(fd_, 16);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~GarbageServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  int served() const { return served_; }

 private:
  void Serve() {
    while (!stop_) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ++served_;  // before the reply, so the client never sees it first
      char buf[4096];
      (void)::recv(c, buf, sizeof(buf), 0);
      (void)::send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL);
      if (keep_open_) {
        open_.push_back(c);
      } else {
        ::close(c);
      }
    }
    for (int c : open_) ::close(c);
  }
  std::string reply_;
  bool keep_open_ = false;
  std::vector<int> open_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> served_{0};
  std::thread thread_;
};

TEST(EtcdClientTest, MalformedRepliesAreErrorsNotCrashes) {
  const std::vector<std::string> replies = {
      "SSH-2.0-OpenSSH_9.2\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{\"a\":",
      "HTTP/1.1 200 OK\r\n\r\n{}",
      "HTTP/1.1 500 Internal\r\nContent-Length: 2\r\n\r\n[]",
  };
  for (const std::string& reply : replies) {
    GarbageServer server(reply);
    EtcdOptions o;
    o.endpoints = {server.endpoint()};
    o.timeout = milliseconds(400);
    auto t0 = std::chrono::steady_clock::now();
    auto c = EtcdClient::Connect(o);
    EXPECT_FALSE(c.ok()) << reply;
    EXPECT_NE(c.status().message().find(server.endpoint()), std::string::npos)
        << c.status().message();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2000));
    // The client did reach it (the server's thread may run late on a loaded
    // machine; it counts a connection once accepted).
    for (int i = 0; i < 200 && server.served() < 1; ++i)
      std::this_thread::sleep_for(milliseconds(10));
    EXPECT_GE(server.served(), 1);
  }
}

// Hostile framing from something that keeps the connection open: an
// endless head, a length or chunk size past any reply's, one that
// overflows. Each is refused as soon as it is read, and said so (the
// client tries again until its deadline, as with any member that fails),
// not read on with memory growing until the deadline says "no answer".
TEST(EtcdClientTest, OversizedOrOverflowingFramingIsRefusedAtOnce) {
  const std::string ok = "HTTP/1.1 200 OK\r\n";
  std::string endless_head = ok;
  while (endless_head.size() < (80 << 10)) endless_head += "X-Filler: aaaa\r\n";
  const std::vector<std::string> replies = {
      endless_head,
      ok + "Content-Length: 99999999999\r\n\r\n{",
      ok + "Content-Length: 18446744073709551617\r\n\r\n{",
      ok + "Content-Length: -5\r\n\r\n{",
      ok + "Transfer-Encoding: chunked\r\n\r\n7fffffffffff\r\n{",
      ok + "Transfer-Encoding: chunked\r\n\r\n10000000000000001\r\n{",
      ok + "Transfer-Encoding: chunked\r\n\r\n" + std::string(4096, '1'),
  };
  for (const std::string& reply : replies) {
    GarbageServer server(reply, true);
    EtcdOptions o;
    o.endpoints = {server.endpoint()};
    o.timeout = milliseconds(800);
    auto c = EtcdClient::Connect(o);
    ASSERT_FALSE(c.ok()) << reply.substr(0, 80);
    EXPECT_NE(c.status().message().find("too large"), std::string::npos)
        << c.status().message();
  }
}

TEST(EtcdClientTest, Base64RoundTripsEveryByte) {
  for (size_t n : {0, 1, 2, 3, 4, 255, 256, 1000}) {
    std::string bytes(n, '\0');
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(i * 7 + 3);
    std::string back;
    ASSERT_TRUE(Base64Decode(Base64Encode(bytes), &back));
    EXPECT_EQ(back, bytes) << n;
  }
  std::string out;
  EXPECT_FALSE(Base64Decode("abc", &out));
  EXPECT_EQ(PrefixEnd("a/b/"), "a/b0");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
}

}  // namespace
}  // namespace dtrun::rendezvous
