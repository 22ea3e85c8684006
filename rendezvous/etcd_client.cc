// etcd's JSON gateway: one member connection per client (plus one per
// watch, etcd_connection.h), failover across members, authentication, and
// watches that move to another member without losing a change. Replies are
// either sized (Content-Length) or chunked; a watch's reply is an endless
// chunked stream of one JSON message per line.
#include "rendezvous/etcd_client.h"

#include <openssl/evp.h>

#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "rendezvous/etcd_connection.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/socket_util.h"

namespace dtrun::rendezvous {
namespace framing = etcd_framing;
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;

// gRPC status codes the gateway passes on, and those that mean "try another
// member": unavailable (no leader, member stopping), deadline exceeded
// (request timed out waiting for a commit), aborted, unknown.
bool RetryableCode(int64_t code) {
  return code == 14 || code == 4 || code == 10 || code == 2 || code == 1;
}

// "host:port" or "[v6]:port" -> host (without brackets), port 1-65535.
// The last colon splits, so a bare IPv6 address is refused (its port would
// be ambiguous): give it in brackets.
bool SplitHostPort(const std::string& text, std::string* host, uint16_t* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = text.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  const std::string digits = text.substr(colon + 1);
  if (digits.empty() || digits.size() > 5) return false;
  for (char c : digits)
    if (c < '0' || c > '9') return false;
  int value = std::stoi(digits);
  if (value <= 0 || value > 65535) return false;
  *port = static_cast<uint16_t>(value);
  return true;
}

}  // namespace

struct EtcdClient::Tls {
  asio::ssl::context context{asio::ssl::context::tls_client};
};

struct EtcdClient::Io {
  asio::io_context io{1};
  std::mutex mu;
};

// Each client starts at a member of its own choosing, so that a job's nodes
// spread their requests over the cluster instead of all asking the first.
EtcdClient::EtcdClient(EtcdOptions options)
    : options_(std::move(options)), io_(std::make_unique<Io>()) {
  if (!options_.endpoints.empty()) {
    std::random_device seed;
    current_ = seed() % options_.endpoints.size();
  }
}
EtcdClient::~EtcdClient() = default;

Result<std::unique_ptr<EtcdClient>> EtcdClient::Connect(EtcdOptions options) {
  std::unique_ptr<EtcdClient> client(new EtcdClient(std::move(options)));
  Status s = client->Init();
  if (!s.ok()) return s;
  auto status =
      client->Call("/v3/maintenance/status", nlohmann::json::object());
  if (!status.ok()) return status.status();
  return client;
}

// Checks the endpoints and loads the TLS files, naming what is wrong.
Status EtcdClient::Init() {
  if (options_.endpoints.empty())
    return Status::Invalid("no etcd endpoint given");
  for (const std::string& e : options_.endpoints) {
    std::string host;
    uint16_t port = 0;
    if (!SplitHostPort(e, &host, &port)) {
      return Status::Invalid("etcd endpoint '" + e +
                             "' is not HOST:PORT (for example 10.0.0.1:2379)");
    }
  }
  if (!options_.tls) return Status::Ok();
  tls_ = std::make_unique<Tls>();
  asio::error_code ec;
  auto load = [&](const std::string& what, const std::string& path,
                  auto&& use) -> Status {
    if (path.empty()) return Status::Ok();
    if (!std::ifstream(path)) {
      return Status::Invalid("--rdzv-conf " + what + "=" + path +
                             ": cannot read the file");
    }
    use(path, ec);
    if (ec) {
      return Status::Invalid("--rdzv-conf " + what + "=" + path +
                             ": not a usable PEM file (" + ec.message() + ")");
    }
    return Status::Ok();
  };
  auto& ctx = tls_->context;
  Status s = options_.cacert.empty()
                 ? (ctx.set_default_verify_paths(ec), Status::Ok())
                 : load("cacert", options_.cacert,
                        [&](auto& p, auto& e) { ctx.load_verify_file(p, e); });
  if (s.ok()) {
    s = load("cert", options_.cert,
             [&](auto& p, auto& e) { ctx.use_certificate_chain_file(p, e); });
  }
  if (s.ok()) {
    s = load("key", options_.key, [&](auto& p, auto& e) {
      ctx.use_private_key_file(p, asio::ssl::context::pem, e);
    });
  }
  if (s.ok() && options_.cert.empty() != options_.key.empty()) {
    return Status::Invalid(
        "--rdzv-conf: cert and key go together (the client certificate and "
        "its private key)");
  }
  return s;
}

// What one request's tries found, for its error when all of them fail.
struct EtcdClient::Tries {
  std::vector<std::string> said;  // per member: what it answered
  // reached: a member took the request (up, but maybe unable to commit);
  // refused: a TLS handshake failed.
  bool reached = false, refused = false;
  // a member refused the request's auth token (gRPC code 16)
  bool unauthenticated = false;
};

// With a user, the first request authenticates, and one that etcd refuses
// for its token (expired: gRPC's Unauthenticated) authenticates again and
// is sent once more.
Result<nlohmann::json> EtcdClient::Call(const std::string& path,
                                        const nlohmann::json& body) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string text = body.dump();
  if (!options_.user.empty() && Token().empty()) {
    Status s = Authenticate();
    if (!s.ok()) return s;
  }
  bool unauthenticated = false;
  auto reply = CallLocked(path, text, &unauthenticated);
  if (!unauthenticated || options_.user.empty()) return reply;
  Status s = Authenticate();
  if (!s.ok()) return s;
  return CallLocked(path, text, &unauthenticated);
}

Result<nlohmann::json> EtcdClient::CallLocked(const std::string& path,
                                              const std::string& text,
                                              bool* unauthenticated) {
  const TimePoint deadline = SteadyClock::now() + options_.timeout;
  const size_t n = options_.endpoints.size();
  // Each member gets a share of the time, so that one that accepts and
  // never answers (stopped, cut off) does not hold the request.
  const auto share =
      std::max(milliseconds(100), options_.timeout / static_cast<int64_t>(n));
  Tries tries;
  tries.said.resize(n);
  for (int pass = 0; SteadyClock::now() < deadline; ++pass) {
    // From the member used last, each once a pass (Try moves current_).
    const size_t first = current_;
    for (size_t i = 0; i < n && SteadyClock::now() < deadline; ++i) {
      const size_t at = (first + i) % n;
      auto reply = Try(at, path, text,
                       std::min(deadline, SteadyClock::now() + share), &tries);
      if (reply) {
        *unauthenticated = tries.unauthenticated;
        return std::move(*reply);
      }
    }
    sockets::SleepUntil(SteadyClock::now() +
                        milliseconds(std::min(50 * (pass + 1), 200)));
  }
  return Failed(path, tries);
}

// One try of a request on member `at`: the reply, a refusal that another
// member would repeat, or nullopt to try the next member.
std::optional<Result<nlohmann::json>> EtcdClient::Try(size_t at,
                                                      const std::string& path,
                                                      const std::string& text,
                                                      TimePoint until,
                                                      Tries* tries) {
  const std::string& endpoint = options_.endpoints[at];
  asio::error_code ec;
  if (!conn_ || current_ != at || !conn_->reusable()) {
    std::string host;
    uint16_t port = 0;
    SplitHostPort(endpoint, &host, &port);
    conn_ = NewConnection(host, port);
    current_ = at;
    ec = conn_->Open(
        std::min(until, SteadyClock::now() + options_.connect_timeout));
    if (!ec) local_address_ = conn_->LocalAddress();
  }
  int status = 0;
  std::string reply;
  conn_->set_token(Token());
  if (!ec) ec = conn_->Send(path, text, until);
  // Sent, and no answer in time: the member is up but cannot commit (or is
  // stopped); a reset or refusal means it is down.
  bool sent = !ec;
  if (!ec) ec = conn_->ReadHead(until, &status);
  if (!ec) ec = conn_->ReadBody(until, &reply);
  if (sent && ec == asio::error::timed_out) tries->reached = true;
  if (ec) {
    tries->said[at] = DescribeEtcdError(ec);
    if (options_.tls && ec.category() == asio::error::get_ssl_category())
      tries->refused = true;
    conn_.reset();
    return std::nullopt;
  }
  tries->reached = true;
  return Judge(at, path, status, reply, tries);
}

// A member's answer: the reply's JSON, a refusal another member would
// repeat (auth, a bad request), or nullopt when another member may do
// better (no leader, stopping, overloaded).
std::optional<Result<nlohmann::json>> EtcdClient::Judge(
    size_t at, const std::string& path, int status, const std::string& reply,
    Tries* tries) {
  const std::string& endpoint = options_.endpoints[at];
  auto json = nlohmann::json::parse(reply, nullptr, false);
  if (status == 200 && json.is_object()) {
    trouble_ = EtcdTrouble::kNone;
    return Result<nlohmann::json>(std::move(json));
  }
  std::string error = framing::StrField(json, "error");
  if (error.empty()) error = reply.substr(0, 200);
  const int64_t code = framing::IntField(json, "code");
  tries->said[at] = error;
  tries->unauthenticated = code == 16 || status == 401;
  if (!RetryableCode(code) && status != 503) {
    trouble_ = EtcdTrouble::kRefused;
    return Result<nlohmann::json>(Status::Invalid(
        "etcd " + endpoint + " refused " + path + ": " + error));
  }
  conn_.reset();
  return std::nullopt;
}

// The error of a request no member answered, naming what each said.
Status EtcdClient::Failed(const std::string& path, const Tries& tries) {
  trouble_ = tries.refused   ? EtcdTrouble::kRefused
             : tries.reached ? EtcdTrouble::kNoQuorum
                             : EtcdTrouble::kUnreachable;
  std::string what;
  for (size_t i = 0; i < tries.said.size(); ++i) {
    what += (i ? "; " : "") + options_.endpoints[i] + ": " +
            (tries.said[i].empty() ? "not tried" : tries.said[i]);
  }
  std::string head =
      trouble_ == EtcdTrouble::kNoQuorum
          ? "etcd has no quorum (members are up, none can commit)"
      : trouble_ == EtcdTrouble::kRefused
          ? "etcd refused the TLS connection (check cacert, cert and key)"
          : "no etcd member reachable";
  const auto waited =
      std::chrono::duration_cast<milliseconds>(options_.timeout).count();
  return Status::Unavailable(head + " within " + std::to_string(waited) +
                             " ms for " + path + " (" + what + ")");
}

// The watch: one /v3/watch request carrying a create request per key (the
// gateway reads them one after another from the body), whose reply streams
// every key's events on one connection.
struct EtcdWatch::Stream {
  std::unique_ptr<EtcdConnection> conn;
  std::string pending;  // the stream's text not yet split into messages
};

EtcdWatch::EtcdWatch(EtcdClient* client, std::string prefix)
    : client_(client), prefix_(std::move(prefix)) {}
EtcdWatch::~EtcdWatch() = default;

// (Re)opens the stream for every key on the member the client uses now
// (another one, if that one does not answer): each key from the revision
// after the last one it reported, a new key from now.
Status EtcdWatch::Open() {
  Status last = Status::Ok();
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt > 0) {
      // Let the client find a member that answers.
      auto status =
          client_->Call("/v3/maintenance/status", nlohmann::json::object());
      if (!status.ok()) return status.status();
    }
    last = OpenOn(client_->endpoint());
    if (last.ok()) return last;
  }
  return last;
}

namespace {

// One confirmation per key, in the order asked; each carries the revision
// its watch starts after.
asio::error_code ReadCreated(EtcdConnection& c, std::string* pending,
                             std::vector<framing::WatchedKey>* keys,
                             TimePoint deadline) {
  size_t created = 0;
  while (created < keys->size()) {
    std::string chunk;
    bool last = false;
    asio::error_code ec = c.NextChunk(deadline, &chunk, &last);
    if (!ec && last) ec = asio::error::eof;
    if (ec) return ec;
    if (pending->size() + chunk.size() > framing::kMaxBody)
      return asio::error::message_size;
    *pending += chunk;
    size_t eol;
    while (created < keys->size() &&
           (eol = pending->find('\n')) != std::string::npos) {
      auto msg = nlohmann::json::parse(pending->substr(0, eol), nullptr, false);
      pending->erase(0, eol + 1);
      auto inner = msg.is_object() ? msg.find("result") : msg.end();
      const nlohmann::json& result =
          msg.is_object() && inner != msg.end() ? *inner : msg;
      if (!framing::BoolField(result, "created"))
        return asio::error::invalid_argument;
      framing::WatchedKey& k = (*keys)[created++];
      auto header = result.find("header");
      if (k.revision == 0 && header != result.end())
        k.revision = framing::IntField(*header, "revision");
    }
  }
  return {};
}

}  // namespace

Status EtcdWatch::OpenOn(const std::string& endpoint) {
  const TimePoint deadline = SteadyClock::now() + client_->options().timeout;
  std::string host;
  uint16_t port = 0;
  SplitHostPort(endpoint, &host, &port);
  stream_ = std::make_unique<Stream>();
  stream_->conn = client_->NewConnection(host, port);
  std::string body;
  for (const Key& k : keys_) {
    nlohmann::json create = {{"key", Base64Encode(k.key)}};
    if (k.revision > 0) create["start_revision"] = k.revision + 1;
    body += nlohmann::json({{"create_request", create}}).dump() + "\n";
  }
  int status = 0;
  EtcdConnection& c = *stream_->conn;
  asio::error_code ec = c.Open(std::min(
      deadline, SteadyClock::now() + client_->options().connect_timeout));
  if (!ec) ec = c.Send("/v3/watch", body, deadline);
  if (!ec) ec = c.ReadHead(deadline, &status);
  if (!ec && status != 200) ec = asio::error::connection_refused;
  if (!ec) ec = ReadCreated(c, &stream_->pending, &keys_, deadline);
  if (!ec) return Status::Ok();
  stream_.reset();
  return Status::Unavailable("etcd " + endpoint + ": cannot watch " +
                             keys_.back().key + ": " + DescribeEtcdError(ec));
}

Status EtcdWatch::WatchKey(const std::string& key) {
  keys_.push_back(Key{prefix_ + key, 0});
  Status st = Open();
  if (!st.ok()) keys_.pop_back();
  return st;
}

// Each stream is a connection and an HTTP request to a member: the keys of
// one call share one.
Status EtcdWatch::WatchKeys(const std::vector<std::string>& keys) {
  const size_t before = keys_.size();
  for (const auto& key : keys) keys_.push_back(Key{prefix_ + key, 0});
  Status st = Open();
  if (!st.ok()) keys_.resize(before);
  return st;
}

// Splits the stream's messages into changes; false on a canceled watch.
bool EtcdWatch::Drain(std::vector<KeyChange>* changes) {
  return framing::DrainWatch(&stream_->pending, prefix_, &keys_, changes);
}

Result<bool> EtcdWatch::AwaitChange(milliseconds timeout) {
  const TimePoint deadline = SteadyClock::now() + timeout;
  for (;;) {
    Status s = TakeChanges(&buffered_);
    if (!s.ok()) return s;
    if (!buffered_.empty()) return true;
    if (!stream_ || SteadyClock::now() >= deadline) return false;
    stream_->conn->Readable(
        std::min(deadline, SteadyClock::now() + milliseconds(500)));
  }
}

Status EtcdWatch::TakeChanges(std::vector<KeyChange>* changes) {
  if (changes != &buffered_) {
    changes->insert(changes->end(), buffered_.begin(), buffered_.end());
    buffered_.clear();
  }
  if (keys_.empty()) return Status::Ok();
  bool broken = !stream_;
  while (!broken && stream_->conn->Readable()) {
    std::string chunk;
    bool last = false;
    auto ec = stream_->conn->NextChunk(SteadyClock::now() + milliseconds(200),
                                       &chunk, &last);
    if (ec || last ||
        stream_->pending.size() + chunk.size() > framing::kMaxBody) {
      broken = true;  // an endless message: a new stream
      break;
    }
    stream_->pending += chunk;
  }
  if (stream_ && !Drain(changes)) {
    return Status::Unavailable("etcd canceled the watch of " + keys_[0].key);
  }
  // Its member went away: resume on another one where each key stood, so
  // no change is lost.
  return broken ? Open() : Status::Ok();
}

std::unique_ptr<EtcdConnection> EtcdClient::NewConnection(
    const std::string& host, uint16_t port) {
  auto conn = std::make_unique<EtcdConnection>(
      host, port, tls_ ? &tls_->context : nullptr, io_->io, io_->mu);
  conn->set_token(Token());
  return conn;
}

std::string EtcdClient::Token() const {
  std::lock_guard<std::mutex> lock(token_mu_);
  return token_;
}

// etcd's Authenticate: the user's token for the requests that follow
// (etcd's simple tokens expire after 5 minutes unused by default; Call
// asks again when told so). REQUIRES: mu_ held.
Status EtcdClient::Authenticate() {
  {
    std::lock_guard<std::mutex> lock(token_mu_);
    token_.clear();
  }
  const nlohmann::json credentials = {{"name", options_.user},
                                      {"password", options_.password}};
  bool unauthenticated = false;
  auto reply =
      CallLocked("/v3/auth/authenticate", credentials.dump(), &unauthenticated);
  if (!reply.ok()) {
    if (trouble_ != EtcdTrouble::kRefused) return reply.status();
    return Status::Invalid("etcd refused user '" + options_.user +
                           "' (check --rdzv-conf user and password_file): " +
                           reply.status().message());
  }
  const std::string token = framing::StrField(*reply, "token");
  if (token.empty()) {
    return Status::Invalid("etcd authenticated user '" + options_.user +
                           "' but gave no token");
  }
  std::lock_guard<std::mutex> lock(token_mu_);
  token_ = token;
  return Status::Ok();
}

std::string EtcdClient::endpoint() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_.endpoints[current_];
}

std::string EtcdClient::LocalAddress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return local_address_;
}

EtcdTrouble EtcdClient::trouble() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trouble_;
}

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

}  // namespace dtrun::rendezvous
