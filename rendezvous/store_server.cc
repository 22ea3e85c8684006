// The server's shell: sockets, buffers and the event loop; StoreState does
// the rest. What matters for speed, and why it is done this way:
//
// One wake-up per request. A reply is written from the read handler that
// produced it, with a non-blocking write_some, instead of posting an async
// write that would cost a second trip through epoll. Replies produced by
// one read (a client may pipeline many requests) are sent together: the
// sessions touched are collected in dirty_ and flushed once, after the
// whole read is decoded (FlushDirty). Only a full socket waits for
// writability.
//
// Gather writes. A session's output is a deque of segments, and one
// write_some hands up to 16 of them to the kernel (writev), so a reply of
// many small values or a length followed by a shared value costs one
// system call.
//
// Shared value buffers. A large GET reply is queued as a reference to the
// stored value (StoredValue's shared_ptr), not a copy: 8 clients reading a
// 64 MiB value hold one copy in memory, and a SET meanwhile replaces the
// pointer without touching bytes still being sent.
//
// Backpressure. A client that pipelines requests but does not read the
// replies would grow its queue without bound; past max_pending_reply_bytes
// the session stops reading until the kernel has taken enough, which also
// stops the client through TCP flow control.
//
// Everything here runs on the loop thread; the public methods reach it by
// posting (OnLoop), so nothing needs a lock.

#include "rendezvous/store_server.h"
#include "rendezvous/store_server_impl.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <deque>
#include <fstream>
#include <future>
#include <thread>
#include <unordered_map>
#include <vector>

#include <asio.hpp>

#include "rendezvous/util/check.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/name_lookup.h"
#include "rendezvous/store_state.h"

namespace dtrun::rendezvous {
namespace {

// A first request of 0x00 that failed to decode as 1.13 was probably a
// torch>=2.2 VALIDATE with another magic (another protocol version): the
// message says so, with the magic received.
std::string WrongMagicHint(const Session& s, std::string_view avail) {
  if (s.requests != 0 || avail.empty() || avail[0] != 0 ||
      s.dialect != Dialect::kTorch113) {
    return "";
  }
  uint32_t magic = 0;
  size_t pos = 1;
  GetU32(avail, &pos, &magic);
  char hex[16];
  std::snprintf(hex, sizeof(hex), "0x%08X", magic);
  return std::string(" (or a VALIDATE with wrong magic ") + hex +
         ", expected 0x3C85F7CE)";
}

}  // namespace

// "::" is tried first as a dual-stack socket (v6_only off), which also
// takes IPv4 clients; hosts without IPv6 fall back to 0.0.0.0.
// reuse_address lets a restarted agent bind its port while connections of
// the previous run sit in TIME_WAIT.
Status StoreServer::Impl::Listen() {
  std::vector<std::string> hosts = {opts_.host};
  if (opts_.host == "::") hosts.push_back("0.0.0.0");
  std::string last_error;
  for (const auto& host : hosts) {
    asio::error_code ec;
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(host, std::to_string(opts_.port),
                                    tcp::resolver::passive, ec);
    if (ec) {
      last_error = "cannot resolve '" + host + "': " + ec.message() +
                   os::NameLookupHint();
      continue;
    }
    for (const auto& r : results) {
      tcp::endpoint ep = r.endpoint();
      acceptor_.close(ec);
      acceptor_.open(ep.protocol(), ec);
      if (!ec && ep.address().is_v6())
        acceptor_.set_option(asio::ip::v6_only(false), ec);
      if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
      if (!ec) acceptor_.bind(ep, ec);
      if (!ec) acceptor_.listen(opts_.backlog, ec);
      if (!ec) {
        port_ = acceptor_.local_endpoint().port();
        host_ = host;
        return Status::Ok();
      }
      last_error =
          "cannot listen on " + FormatEndpoint(ep) + ": " + ec.message();
    }
  }
  acceptor_.close();
  return Status::Unavailable(
      "store: " + last_error +
      "; choose another --port (0 picks a free one) or --host");
}

void StoreServer::Impl::Accept() {
  acceptor_.async_accept(
      [this](const asio::error_code& ec, tcp::socket socket) {
        if (ec == asio::error::operation_aborted || stopped_) return;
        if (ec) {
          // Out of descriptors (EMFILE) and the like: accepting again at once
          // would spin, so back off briefly and keep serving who we have.
          log_->warn("accept failed: {}; retrying in 50 ms", ec.message());
          accept_retry_.expires_after(std::chrono::milliseconds(50));
          accept_retry_.async_wait([this](const asio::error_code& e) {
            if (!e) Accept();
          });
          return;
        }
        asio::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        // A fixed send buffer of 384 KiB (192 KiB, doubled by the kernel).
        // Loopback's own starts at 16 KiB and grows slowly (a 1 MiB reply in
        // ~17 writes, each a trip through epoll); a large one (4 MiB) let a
        // read of many 1 MiB GETs queue megabytes per connection at once, and
        // the load generator's 1 MiB gets ran at 1.1-1.6x torch's server on
        // one core and 0.6-1.3x across cores. At 192 KiB: 3.1-3.5x and
        // 1.2-1.5x (tests/bench/README.md, "Store, server-bound").
        socket.set_option(asio::socket_base::send_buffer_size(kSendBufferBytes),
                          ignored);
        // Replies are written at once from the handler that made them (one
        // wake-up of the loop per request); only a full socket waits.
        socket.non_blocking(true, ignored);
        auto s = std::make_shared<Session>(std::move(socket), next_id_++);
        auto remote = s->socket.remote_endpoint(ignored);
        s->peer = ignored ? "unknown peer" : FormatEndpoint(remote);
        sessions_.emplace(s->id, s);
        log_->debug("connection {} from {}", s->id, s->peer);
        StartRead(s);
        Accept();
      });
}

void StoreServer::Impl::StartRead(const std::shared_ptr<Session>& s) {
  if (s->read_busy || s->closed) return;
  s->read_busy = true;
  s->socket.async_read_some(
      asio::buffer(s->buf.get(), kReadChunk),
      [this, s](const asio::error_code& ec, size_t n) { OnRead(s, ec, n); });
}

void StoreServer::Impl::OnRead(const std::shared_ptr<Session>& s,
                               const asio::error_code& ec, size_t n) {
  s->read_busy = false;
  if (s->closed) return;
  if (ec) {
    if (ec != asio::error::eof && ec != asio::error::connection_reset) {
      log_->debug("connection {} from {}: {}", s->id, s->peer, ec.message());
    }
    Close(s.get(), "");
    FlushDirty();  // what its on-close ADD woke
    return;
  }
  s->in.append(s->buf.get(), n);
  bool alive = Process(s.get());
  FlushDirty();
  if (!alive) return;
  // Backpressure: a client that sends requests but never reads its replies
  // is not read from until they drain (StartWrite resumes reading).
  if (Pending(*s) <= opts_.max_pending_reply_bytes) StartRead(s);
}

// A connection whose first byte is the multiplexed hello's is a node's
// proxy (store_server_mux.cc); every other speaks TCPStore's wire. False
// when the connection was closed.
bool StoreServer::Impl::Process(Session* s) {
  if (s->mux) return ProcessMux(s);
  if (!s->sub() && s->requests == 0 && s->dialect == Dialect::kUnknown) {
    std::string_view avail(s->in.data() + s->in_off, s->in.size() - s->in_off);
    if (LooksLikeMuxHello(avail)) return StartMux(s, avail);
  }
  return ProcessRequests(s);
}

// Decodes and applies every whole request buffered. `need` is the size the
// decoder asked for, so a large value arriving in 64 KiB reads is decoded
// once, when complete. False when the connection was closed.
bool StoreServer::Impl::ProcessRequests(Session* s) {
  while (s->in.size() - s->in_off >= s->need) {
    std::string_view avail(s->in.data() + s->in_off, s->in.size() - s->in_off);
    // The dialect is fixed by the first bytes of the connection; fewer than
    // five that match VALIDATE's leave it open until more arrive.
    if (s->dialect == Dialect::kUnknown) {
      s->dialect = DetectDialect(avail);
      if (s->dialect == Dialect::kUnknown) {
        s->need = 5;
        break;
      }
    }
    Request req;
    size_t consumed = 0;
    std::string error;
    DecodeState st =
        DecodeRequest(avail, s->dialect, opts_.limits, &req, &consumed, &error);
    if (st == DecodeState::kNeedMore) {
      s->need = consumed;
      break;
    }
    if (st == DecodeState::kMalformed) {
      Close(s, "malformed request: " + error + WrongMagicHint(*s, avail));
      return false;
    }
    s->in_off += consumed;
    s->need = 1;
    if (s->dialect == Dialect::kTorch2 && s->requests == 0 &&
        req.op != Op::kValidate) {
      Close(s, std::string("first request is ") + OpName(req.op) +
                   ", not VALIDATE");
      return false;
    }
    ++s->requests;
    ++requests_;
    log_->trace("connection {}: {}", s->id, OpName(req.op));
    Status status = state_.Apply(s->id, req, this);
    if (!status.ok()) {
      Close(s, status.message());
      return false;
    }
  }
  CompactInput(s);
  return true;
}

// Consumed bytes are dropped only when all are consumed or a chunk's worth
// has piled up, so pipelined small requests do not shift the buffer once
// each.
void StoreServer::Impl::CompactInput(Session* s) {
  if (s->in_off == s->in.size()) {
    s->in.clear();
    s->in_off = 0;
  } else if (s->in_off >= kReadChunk) {
    s->in.erase(0, s->in_off);
    s->in_off = 0;
  }
}

Session* StoreServer::Impl::Dirty(ConnId conn) {
  auto it = sessions_.find(conn);
  if (it == sessions_.end() || it->second->closed) return nullptr;
  Session* s = it->second.get();
  if (!s->dirty) {
    s->dirty = true;
    dirty_.push_back(it->second);
  }
  return s;
}

std::string* StoreServer::Impl::Out(ConnId conn) {
  Session* s = Dirty(conn);
  if (!s) return nullptr;
  // Appends go to the last owned segment (deque: its address is stable).
  if (s->out.empty() || s->out.back().shared) s->out.emplace_back();
  return &s->out.back().bytes;
}

void StoreServer::Impl::OutShared(ConnId conn,
                                  std::shared_ptr<const std::string> bytes) {
  Session* s = Dirty(conn);
  if (s) s->out.push_back(Segment{std::string(), std::move(bytes)});
}

// A write that fails closes its connection, whose on-close ADD (StoreState
// ::Disconnect) may wake others: they join dirty_ while it is flushed, so
// it is taken in batches until none is left.
void StoreServer::Impl::FlushDirty() {
  while (!dirty_.empty()) {
    std::vector<std::shared_ptr<Session>> batch;
    batch.swap(dirty_);
    for (auto& s : batch) {
      s->dirty = false;
      StartWrite(s);
    }
  }
}

size_t StoreServer::Impl::Pending(const Session& s) {
  size_t n = 0;
  for (const auto& seg : s.out) n += seg.view().size();
  return n - s.out_off;
}

// Hands queued replies to the kernel, several segments per system call
// (gather write), until the queue is empty or the socket is full. False
// when the connection failed (and is closed).
bool StoreServer::Impl::WriteNow(Session* s) {
  while (!s->out.empty()) {
    std::array<asio::const_buffer, 16> bufs;
    size_t n = 0;
    for (size_t i = 0; i < s->out.size() && n < bufs.size(); ++i) {
      std::string_view v = s->out[i].view();
      if (i == 0) v.remove_prefix(s->out_off);
      if (!v.empty()) bufs[n++] = asio::buffer(v.data(), v.size());
    }
    if (n == 0) {  // only empty segments (requests with no reply)
      s->out.clear();
      break;
    }
    asio::error_code ec;
    size_t wrote = s->socket.write_some(bufs, ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again)
      return true;
    if (ec) {
      Close(s, "");
      return false;
    }
    while (wrote > 0) {
      DTRUN_CHECK(!s->out.empty())
          << "the kernel took " << wrote << " bytes more than were queued";
      size_t left = s->out.front().view().size() - s->out_off;
      if (wrote < left) {
        s->out_off += wrote;
        break;
      }
      wrote -= left;
      s->out.pop_front();
      s->out_off = 0;
    }
    while (!s->out.empty() && s->out.front().view().size() == s->out_off) {
      s->out.pop_front();
      s->out_off = 0;
    }
  }
  if (s->out.empty()) s->out_off = 0;
  return true;
}

void StoreServer::Impl::StartWrite(const std::shared_ptr<Session>& s) {
  if (s->write_busy || s->closed || s->out.empty()) return;
  if (s->sub()) {  // its parent's socket carries it
    FrameStream(s.get());
    return;
  }
  if (!WriteNow(s.get())) return;
  if (s->out.empty()) {
    // All sent: a connection held back by unread replies reads again.
    StartRead(s);
    return;
  }
  // The socket is full: wait until it takes more.
  s->write_busy = true;
  s->socket.async_wait(
      tcp::socket::wait_write, [this, s](const asio::error_code& ec) {
        s->write_busy = false;
        if (s->closed) return;
        if (ec) {
          Close(s.get(), "");
          FlushDirty();
          return;
        }
        StartWrite(s);
        if (!s->closed && Pending(*s) <= opts_.max_pending_reply_bytes)
          StartRead(s);
      });
}

void StoreServer::Impl::Close(Session* s, const std::string& reason) {
  if (s->sub()) {
    CloseStream(s, reason, /*tell_proxy=*/true);
    return;
  }
  if (s->closed) return;
  s->closed = true;
  if (s->mux) {  // its streams end with it, before it
    auto streams = s->streams;
    for (const auto& kv : streams) {
      auto it = sessions_.find(kv.second);
      if (it != sessions_.end()) CloseStream(it->second.get(), "", false);
    }
  }
  if (!reason.empty()) {
    log_->warn("closing connection from {}: {}", s->peer, reason);
  } else {
    log_->debug("connection {} from {} closed", s->id, s->peer);
  }
  state_.Disconnect(s->id, this);
  asio::error_code ignored;
  s->socket.shutdown(tcp::socket::shutdown_both, ignored);
  s->socket.close(ignored);
  sessions_.erase(s->id);  // may drop the last owner: touch nothing after
}

void StoreServer::Impl::CloseAll() {
  asio::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  std::vector<std::shared_ptr<Session>> all;
  for (auto& kv : sessions_) all.push_back(kv.second);
  for (auto& s : all) Close(s.get(), "");
}

// Runs `fn` on the loop thread and waits for its result: the state and the
// sessions are the loop's alone.
template <typename Fn>
auto StoreServer::Impl::OnLoop(Fn fn) -> decltype(fn()) {
  std::packaged_task<decltype(fn())()> task(std::move(fn));
  auto result = task.get_future();
  asio::post(io_, [&task] { task(); });
  return result.get();
}

Result<std::unique_ptr<StoreServer>> StoreServer::Start(
    const StoreServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  Status s = impl->Listen();
  if (!s.ok()) return s;
  impl->Accept();
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreServer::~StoreServer() { Stop(); }

const std::string& StoreServer::host() const { return impl_->host_; }
uint16_t StoreServer::port() const { return impl_->port_; }

void StoreServer::Run() { impl_->io_.run(); }

void StoreServer::RunInBackground() {
  impl_->thread_ = std::thread([this] { impl_->io_.run(); });
}

// Closing happens on the loop (the sessions are its own); the join is
// skipped when Stop runs on the loop thread itself, which would deadlock.
void StoreServer::Stop() {
  if (!impl_->stopped_.exchange(true)) {
    asio::post(impl_->io_, [this] {
      impl_->CloseAll();
      impl_->io_.stop();
    });
  }
  if (impl_->thread_.joinable() &&
      impl_->thread_.get_id() != std::this_thread::get_id()) {
    impl_->thread_.join();
  }
}

void StoreServer::WithState(const std::function<void(StoreState&)>& fn) {
  impl_->OnLoop([&] { fn(impl_->state_); });
}

size_t StoreServer::NumConnections() {
  return impl_->OnLoop([this] { return impl_->sessions_.size(); });
}

StoreServer::Counts StoreServer::GetCounts() {
  return impl_->OnLoop([this] {
    return Counts{impl_->sessions_.size(), impl_->state_.NumKeys(),
                  impl_->requests_};
  });
}

std::string AcceptQueueAdvice(int64_t connections, int64_t somaxconn) {
  if (somaxconn <= 0 || connections <= somaxconn) return "";
  return std::to_string(connections) +
         " connections (workers, or their nodes' proxies) arrive at this "
         "store at once and net.core.somaxconn is " +
         std::to_string(somaxconn) +
         ": connections beyond the listen queue wait 1-3 s for the kernel "
         "to retry them; raise it on this host (sysctl -w "
         "net.core.somaxconn=65535), or, if each worker connects, let each "
         "node's dtrun carry its workers (--store-proxy=on)";
}

int64_t SystemSomaxconn() {
  std::ifstream f("/proc/sys/net/core/somaxconn");
  int64_t n = -1;
  return (f >> n) ? n : -1;
}

}  // namespace dtrun::rendezvous
