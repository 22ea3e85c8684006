// A blocking client on one non-blocking socket.
//
// Deadlines. Every operation computes one deadline when it starts and
// passes it down, so connect, send and every partial read share the same
// budget: a reply that trickles in cannot stretch an operation past its
// timeout the way a per-recv timeout would. poll() gets the time left,
// recomputed after EINTR.
//
// Backoff. The first connect may precede the store by seconds (agents
// start in any order), so refused connections are retried for
// connect_timeout, 50 ms doubling to 1 s with +-25% jitter so that many
// agents started together do not knock in lockstep.
//
// Desync. The protocol has no request ids: the n-th reply belongs to the
// n-th request. A request that timed out may still be answered later, and
// that late reply would be read as the answer to the next request. After a
// timed-out WAIT the torch>=2.2 dialect sends CANCEL_WAIT and reads up to
// its acknowledgement (a late "ready" first, when the keys arrived as we
// gave up); any other timeout, and 1.13 (no cancel), drop the connection so
// the next call starts on a fresh one. libtorch 1.13's client does neither.

#include "rendezvous/store_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "rendezvous/store_state.h"
#include "rendezvous/util/describe.h"
#include "rendezvous/util/name_lookup.h"
#include "rendezvous/util/socket_util.h"

namespace dtrun::rendezvous {

using SteadyClock = std::chrono::steady_clock;

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(
    const StoreClientOptions& opts) {
  std::unique_ptr<TcpStoreClient> client(new TcpStoreClient(opts));
  std::lock_guard<std::mutex> lock(client->mu_);
  Status s = client->Open();
  if (!s.ok()) return s;
  return client;
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStoreClient::address() const {
  bool v6 = opts_.host.find(':') != std::string::npos;
  return (v6 ? "[" + opts_.host + "]" : opts_.host) + ":" +
         std::to_string(opts_.port);
}

std::string TcpStoreClient::LocalAddress() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return "";
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return "";
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host),
                  nullptr, 0, NI_NUMERICHOST) != 0) {
    return "";
  }
  std::string out = host;
  if (out.rfind("::ffff:", 0) == 0) out = out.substr(7);  // v4-mapped
  return out;
}

std::string TcpStoreClient::K(const std::string& key) const {
  return opts_.c10d_key_prefix ? "/" + key : key;
}

// One try: resolves the host, connects to the first address that answers
// and shakes hands; true when that worked, else *last_error says why.
bool TcpStoreClient::ConnectOnce(Deadline deadline, std::string* last_error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(opts_.host.c_str(),
                          std::to_string(opts_.port).c_str(), &hints, &res);
  if (gai != 0)
    *last_error = std::string("cannot resolve host: ") + ::gai_strerror(gai) +
                  os::NameLookupHint();
  for (addrinfo* ai = res; ai && fd_ < 0; ai = ai->ai_next)
    fd_ = sockets::ConnectWithin(ai, deadline, last_error);
  if (res) ::freeaddrinfo(res);
  if (fd_ < 0) return false;
  rbuf_.clear();
  Status s = Handshake(SteadyClock::now() + opts_.timeout);
  if (s.ok()) return true;
  *last_error = s.message();
  Fail(Status::Ok());
  return false;
}

// Connects to the first address that answers, retrying refused or
// unreachable ones with exponential backoff and jitter until the deadline,
// then shakes hands in the dialect asked for.
Status TcpStoreClient::Open() {
  auto started = SteadyClock::now();
  // The first connection may wait for the store to come up; a reconnect
  // (after a timeout or a lost connection) is one operation's worth.
  auto deadline =
      started + (connected_once_ ? opts_.timeout : opts_.connect_timeout);
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.75, 1.25);
  auto backoff = std::chrono::milliseconds(50);
  std::string last_error;
  for (int attempt = 1;; ++attempt) {
    if (ConnectOnce(deadline, &last_error)) {
      const bool again = connected_once_;
      connected_once_ = true;
      // The old connection's close counted once; this one binds anew.
      return again && !on_close_.empty() ? Bind(true) : Status::Ok();
    }
    auto now = SteadyClock::now();
    if (now >= deadline) {
      return Status::Unavailable(
          "store " + address() + ": cannot connect after " +
          DescribeSeconds(now - started) + " and " + std::to_string(attempt) +
          " attempts (last error: " + last_error +
          "); check that the store (dtrun or dtstore) is running there and "
          "that "
          "MASTER_ADDR/MASTER_PORT or --rdzv-endpoint point at it");
    }
    auto sleep = std::chrono::duration_cast<std::chrono::milliseconds>(
        backoff * jitter(rng));
    std::this_thread::sleep_for(
        std::min<SteadyClock::duration>(sleep, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

// VALIDATE and PING go out in one write. VALIDATE has no reply, so the PING
// echo is what proves the server took the magic and speaks this dialect.
Status TcpStoreClient::Handshake(Deadline deadline) {
  if (opts_.dialect != Dialect::kTorch2) return Status::Ok();
  Request validate;
  validate.op = Op::kValidate;
  validate.word = kValidateMagic;
  Request ping;
  ping.op = Op::kPing;
  ping.word = static_cast<uint32_t>(::getpid());
  std::string bytes;
  EncodeRequest(validate, Dialect::kTorch2, &bytes);
  EncodeRequest(ping, Dialect::kTorch2, &bytes);
  std::string echo;
  auto started = SteadyClock::now();
  Status sent = SendBytes(bytes, "VALIDATE", deadline);
  if (!sent.ok()) return sent;
  Status s = ReadExact(4, &echo, "PING", deadline, started);
  if (!s.ok()) return s;
  uint32_t got = 0;
  size_t pos = 0;
  GetU32(echo, &pos, &got);
  if (got != ping.word) {
    return Status::Invalid("PING echo mismatch: the server at " + address() +
                           " does not speak the torch>=2.2 store protocol");
  }
  return Status::Ok();
}

// A connection that failed mid-request cannot be trusted to be at a frame
// boundary: it is closed, and the next call reconnects.
Status TcpStoreClient::Fail(Status s) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  rbuf_.clear();
  return s;
}

Status TcpStoreClient::SendRequest(const Request& req, const std::string& what,
                                   Deadline deadline) {
  if (fd_ < 0) {
    Status s = Open();
    if (!s.ok()) return s;
  }
  std::string bytes;
  EncodeRequest(req, opts_.dialect, &bytes);
  return SendBytes(bytes, what, deadline);
}

Status TcpStoreClient::SendBytes(const std::string& bytes,
                                 const std::string& what, Deadline deadline) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n =
        ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 &&
               (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!sockets::PollFor(fd_, POLLOUT, deadline)) {
        return Fail(Status::Timeout("store " + address() + ": " + what +
                                    ": send timed out"));
      }
    } else {
      return Fail(
          Status::Unavailable("store " + address() + ": " + what +
                              ": send failed: " + std::strerror(errno)));
    }
  }
  return Status::Ok();
}

Status TcpStoreClient::ReceiveSome(const std::string& what, Deadline deadline,
                                   Deadline started) {
  if (!sockets::PollFor(fd_, POLLIN, deadline)) {
    return Status::Timeout("store " + address() + ": " + what +
                           ": no reply after " +
                           DescribeSeconds(SteadyClock::now() - started));
  }
  char chunk[64 * 1024];
  ssize_t got = ::recv(fd_, chunk, sizeof(chunk), 0);
  if (got > 0) {
    rbuf_.append(chunk, static_cast<size_t>(got));
  } else if (got == 0) {
    return Fail(Status::Unavailable("store " + address() + ": " + what +
                                    ": connection closed by the store"));
  } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    return Fail(
        Status::Unavailable("store " + address() + ": " + what +
                            ": receive failed: " + std::strerror(errno)));
  }
  return Status::Ok();
}

Status TcpStoreClient::ReadExact(size_t n, std::string* out,
                                 const std::string& what, Deadline deadline,
                                 Deadline started) {
  // Whatever arrives past `n` stays in rbuf_ for the next read: MULTI_GET
  // replies arrive back to back and are taken one value at a time.
  while (rbuf_.size() < n) {
    Status s = ReceiveSome(what, deadline, started);
    if (!s.ok()) return s;
  }
  out->assign(rbuf_, 0, n);
  rbuf_.erase(0, n);
  return Status::Ok();
}

Status TcpStoreClient::ReadBytes(std::string* out, const std::string& what,
                                 Deadline deadline, Deadline started) {
  std::string len_bytes;
  Status s = ReadExact(8, &len_bytes, what, deadline, started);
  if (!s.ok()) return s;
  uint64_t len = 0;
  size_t pos = 0;
  GetU64(len_bytes, &pos, &len);
  return ReadExact(len, out, what, deadline, started);
}

Status TcpStoreClient::WaitLocked(const std::vector<std::string>& keys, Op op,
                                  int64_t number,
                                  std::chrono::milliseconds timeout) {
  Request req;
  req.op = op;
  req.number = number;
  for (const auto& k : keys) req.keys.push_back(K(k));
  std::string what =
      std::string(op == Op::kWait ? "wait for keys " : "barrier on ") +
      DescribeKeys(keys);
  auto started = SteadyClock::now();
  // The caller's timeout bounds the wait itself; the cancel that may follow
  // gets an ordinary operation's deadline of its own.
  Status s = SendRequest(req, what, started + timeout);
  if (!s.ok()) return s;
  std::string reply;
  s = ReadExact(1, &reply, what, started + timeout, started);
  if (s.ok() || s.code() != Status::Code::kTimeout) return s;
  Status timed_out =
      Status::Timeout("store " + address() + ": " + what + " timed out after " +
                      DescribeSeconds(SteadyClock::now() - started) +
                      "; the process that should set them may have failed, or "
                      "use a longer timeout");
  if (opts_.dialect != Dialect::kTorch2) return Fail(timed_out);
  Request cancel;
  cancel.op = Op::kCancelWait;
  s = SendRequest(cancel, "cancel wait", OpDeadline());
  if (s.ok())
    s = ReadExact(1, &reply, "cancel wait", OpDeadline(), SteadyClock::now());
  if (s.ok() && reply[0] == static_cast<char>(kStopWaiting)) {
    // The keys arrived just as we gave up: the late reply comes first.
    s = ReadExact(1, &reply, "cancel wait", OpDeadline(), SteadyClock::now());
  }
  if (!s.ok() || reply[0] != static_cast<char>(kWaitCanceled))
    Fail(Status::Ok());
  return timed_out;
}

// One request and its reply (none, a fixed size, or length-prefixed),
// bounded by the client's timeout; errors name `what` and the time waited.
Status TcpStoreClient::Call(const Request& req, const std::string& what,
                            int reply_size, std::string* reply) {
  auto started = SteadyClock::now();
  auto deadline = started + opts_.timeout;
  Status s = SendRequest(req, what, deadline);
  if (s.ok() && reply_size > 0) {
    s = ReadExact(static_cast<size_t>(reply_size), reply, what, deadline,
                  started);
  } else if (s.ok() && reply_size == kLengthPrefixed) {
    s = ReadBytes(reply, what, deadline, started);
  }
  // A reply that never came may still arrive: start the next call afresh.
  if (s.code() == Status::Code::kTimeout) Fail(Status::Ok());
  return s;
}

namespace {

// APPEND and BARRIER have no opcode in 1.13's protocol.
Status NeedsTorch2(const std::string& what) {
  return Status::Invalid(
      what +
      ": the store client speaks the torch-1.13 protocol, which has "
      "no such request; connect with the torch>=2.2 dialect");
}

int64_t I64(const std::string& bytes) {
  int64_t v = 0;
  size_t pos = 0;
  GetI64(bytes, &pos, &v);
  return v;
}

}  // namespace

Status TcpStoreClient::Set(const std::string& key, std::string_view value) {
  std::lock_guard<std::mutex> lock(mu_);
  return Call(MakeRequest(Op::kSet, {K(key)}, {std::string(value)}),
              "set key '" + key + "'", 0, nullptr);
}

Status TcpStoreClient::Append(const std::string& key, std::string_view value) {
  if (opts_.dialect != Dialect::kTorch2)
    return NeedsTorch2("append to key '" + key + "'");
  std::lock_guard<std::mutex> lock(mu_);
  return Call(MakeRequest(Op::kAppend, {K(key)}, {std::string(value)}),
              "append to key '" + key + "'", 0, nullptr);
}

Result<std::string> TcpStoreClient::Get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  // c10d's GET waits for the key first (a missing key blocks, not fails).
  Status s = WaitLocked({key}, Op::kWait, 0, opts_.timeout);
  std::string value;
  if (s.ok()) {
    s = Call(MakeRequest(Op::kGet, {K(key)}), "get key '" + key + "'",
             kLengthPrefixed, &value);
  }
  if (!s.ok()) return s;
  return value;
}

Result<int64_t> TcpStoreClient::Add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string reply;
  // c10d sends its worker counter "init/" without the "/" prefix.
  Status s =
      Call(MakeRequest(Op::kAdd, {key == "init/" ? key : K(key)}, {}, delta),
           "add to key '" + key + "'", 8, &reply);
  if (!s.ok()) return s;
  return I64(reply);
}

Result<std::string> TcpStoreClient::CompareSet(const std::string& key,
                                               std::string_view expected,
                                               std::string_view desired) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string value;
  Status s = Call(MakeRequest(Op::kCompareSet, {K(key)},
                              {std::string(expected), std::string(desired)}),
                  "compare_set key '" + key + "'", kLengthPrefixed, &value);
  if (!s.ok()) return s;
  return value;
}

Result<bool> TcpStoreClient::Check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> wire_keys;
  for (const auto& k : keys) wire_keys.push_back(K(k));
  std::string reply;
  Status s = Call(MakeRequest(Op::kCheck, std::move(wire_keys)),
                  "check keys " + DescribeKeys(keys), 1, &reply);
  if (!s.ok()) return s;
  return reply[0] == static_cast<char>(kCheckReady);
}

Status TcpStoreClient::Wait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  return WaitLocked(keys, Op::kWait, 0, timeout);
}

Status TcpStoreClient::Barrier(const std::string& key, int64_t world_size,
                               std::chrono::milliseconds timeout) {
  if (opts_.dialect != Dialect::kTorch2)
    return NeedsTorch2("barrier on key '" + key + "'");
  std::lock_guard<std::mutex> lock(mu_);
  return WaitLocked({key}, Op::kBarrier, world_size, timeout);
}

Result<bool> TcpStoreClient::DeleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string reply;
  Status s = Call(MakeRequest(Op::kDeleteKey, {K(key)}),
                  "delete key '" + key + "'", 8, &reply);
  if (!s.ok()) return s;
  return I64(reply) == 1;
}

Result<int64_t> TcpStoreClient::NumKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string reply;
  Status s = Call(MakeRequest(Op::kGetNumKeys, {}), "num_keys", 8, &reply);
  if (!s.ok()) return s;
  return I64(reply);
}

// One MULTI_GET frame in the 2.x dialect; 1.13's servers have none, so
// there it is Store's key-by-key default.
// torch's own server answers MULTI_GET only when every key exists: on a
// missing one it drops the connection (its client waits for the keys
// first). A MULTI_GET that loses its connection is read again key by key
// (Store's default, which reconnects); when that finds a key missing, this
// is such a server, and the client reads key by key from then on. A
// connection lost for another reason loses the per-key reads too, so the
// caller still sees it.
Result<std::vector<std::string>> TcpStoreClient::MultiGet(
    const std::vector<std::string>& keys) {
  if (opts_.dialect != Dialect::kTorch2 || !multi_get_missing_) {
    return Store::MultiGet(keys);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> wire_keys;
    wire_keys.reserve(keys.size());
    for (const auto& k : keys) wire_keys.push_back(K(k));
    std::string what = "multi_get of keys " + DescribeKeys(keys);
    auto started = SteadyClock::now();
    Status s = SendRequest(MakeRequest(Op::kMultiGet, std::move(wire_keys)),
                           what, started + opts_.timeout);
    std::vector<std::string> values(keys.size());
    for (size_t i = 0; s.ok() && i < keys.size(); ++i) {
      s = ReadBytes(&values[i], what, started + opts_.timeout, started);
    }
    // A reply that never came may still arrive: start the next call afresh.
    if (s.code() == Status::Code::kTimeout) Fail(Status::Ok());
    if (s.ok()) return values;
    if (s.code() != Status::Code::kUnavailable) return s;
  }
  auto each = Store::MultiGet(keys);
  if (each.ok() && std::any_of(each->begin(), each->end(),
                               [](const std::string& v) { return v.empty(); }))
    multi_get_missing_ = false;
  return each;
}

Status TcpStoreClient::MultiSet(const std::vector<std::string>& keys,
                                const std::vector<std::string>& values) {
  if (opts_.dialect != Dialect::kTorch2 || keys.size() != values.size()) {
    return Store::MultiSet(keys, values);
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> wire_keys;
  wire_keys.reserve(keys.size());
  for (const auto& k : keys) wire_keys.push_back(K(k));
  return Call(MakeRequest(Op::kMultiSet, std::move(wire_keys), values),
              "multi_set of keys " + DescribeKeys(keys), 0, nullptr);
}

// A watch connection carries two kinds of frames from the store, told
// apart by their first byte: the one-byte acknowledgement of a WATCH_KEY
// (3), and a change (0-2: updated, created, deleted) followed by the key,
// the old value and the new one, each length-prefixed. A change may arrive
// before the acknowledgement of a later WATCH_KEY, so both are parsed
// whenever bytes arrive.
Status TcpStoreClient::ParsePushed(const std::string& what) {
  size_t pos = 0;
  WatchFrame frame;
  for (;;) {
    size_t used = 0;
    std::string error;
    DecodeState state = DecodeWatchFrame(std::string_view(rbuf_).substr(pos),
                                         &frame, &used, &error);
    if (state == DecodeState::kNeedMore) break;
    if (state == DecodeState::kMalformed) {
      return Fail(Status::Invalid("store " + address() + ": " + what + ": " +
                                  error +
                                  "; is this a dtstore or torch 1.13 store?"));
    }
    pos += used;
    if (frame.type == kWatchRegistered) {
      ++acks_;
      continue;
    }
    KeyChange change;
    change.kind = static_cast<KeyChange::Kind>(frame.type);
    change.key = std::move(frame.key);
    if (opts_.c10d_key_prefix && !change.key.empty() && change.key[0] == '/')
      change.key.erase(0, 1);
    change.value = std::move(frame.value);
    changes_.push_back(std::move(change));
  }
  rbuf_.erase(0, pos);
  return Status::Ok();
}

// Registers a watch and waits for its acknowledgement; pushes that arrive
// meanwhile are kept for TakeChanges, in order.
Status TcpStoreClient::WatchKey(const std::string& key) {
  std::string what = "watch key '" + key + "'";
  if (opts_.dialect != Dialect::kTorch113) {
    return Status::Invalid(what +
                           ": WATCH_KEY exists only in the torch-1.13 "
                           "protocol; connect with that dialect");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) {
    return Status::Unavailable("store " + address() + ": " + what +
                               ": the watch connection is closed");
  }
  auto started = SteadyClock::now();
  auto deadline = started + opts_.timeout;
  Status s = SendRequest(MakeRequest(Op::kWatchKey, {K(key)}), what, deadline);
  while (s.ok()) {
    s = ParsePushed(what);
    if (s.ok() && acks_ > 0) {
      --acks_;
      return Status::Ok();
    }
    if (s.ok()) s = ReceiveSome(what, deadline, started);
  }
  // A registration that may still be acknowledged later would leave the
  // count of acknowledgements wrong: the connection is done.
  return Fail(s);
}

// Reads what the store pushed into rbuf_ and parses it into changes_.
// Blocks up to `timeout` for the first bytes (0: not at all).
Status TcpStoreClient::ReadPushed(std::chrono::milliseconds timeout) {
  const std::string what = "watched keys";
  if (fd_ < 0) {
    return Status::Unavailable("store " + address() +
                               ": the watch connection is closed");
  }
  if (timeout.count() > 0) {
    pollfd pfd{fd_, POLLIN, 0};
    int ready = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
    if (ready < 0 && errno != EINTR) {
      return Fail(
          Status::Unavailable("store " + address() + ": " + what +
                              ": poll failed: " + std::strerror(errno)));
    }
  }
  char chunk[64 * 1024];
  for (;;) {
    ssize_t got = ::recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (got > 0) {
      rbuf_.append(chunk, static_cast<size_t>(got));
      continue;
    }
    if (got == 0) {
      return Fail(Status::Unavailable("store " + address() + ": " + what +
                                      ": connection closed by the store"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return Fail(
        Status::Unavailable("store " + address() + ": " + what +
                            ": receive failed: " + std::strerror(errno)));
  }
  return ParsePushed(what);
}

Status TcpStoreClient::TakeChanges(std::vector<KeyChange>* changes) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = ReadPushed(std::chrono::milliseconds(0));
  if (!s.ok()) return s;
  for (auto& c : changes_) changes->push_back(std::move(c));
  changes_.clear();
  return Status::Ok();
}

Result<bool> TcpStoreClient::AwaitChange(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  const Deadline deadline = std::chrono::steady_clock::now() + timeout;
  while (changes_.empty()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    Status s = ReadPushed(left);
    if (!s.ok()) return s;
  }
  return true;
}

Result<std::unique_ptr<KeyWatch>> ConnectWatch(const StoreClientOptions& opts) {
  auto c = TcpStoreClient::Connect(opts);
  if (!c.ok()) return c.status();
  return std::unique_ptr<KeyWatch>(std::move(*c));
}

}  // namespace dtrun::rendezvous
