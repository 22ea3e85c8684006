// The proxy moves bytes and never decodes a worker's request: each worker
// connection is a stream (store_mux.h) whose bytes go up in DATA frames as
// they are read, and the store's DATA frames are cut out of the upstream
// byte stream as they arrive (a large GET reply is passed on piece by
// piece, never held whole). Writes up are batched: frames queued while one
// write is in flight go together in the next. Everything runs on one loop
// thread; handlers hold the Impl by shared_ptr, so a proxy on a caller's
// loop may be destroyed while its last handlers are still queued.
//
// Backpressure: a worker that does not read its replies is closed past
// max_worker_backlog (the others keep going); workers whose bytes the store
// has not taken yet (more than kMaxUpBacklog queued) are not read from
// until it has.

#include "rendezvous/store_proxy.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <future>
#include <thread>
#include <unordered_map>
#include <vector>

#include <asio.hpp>

#include "rendezvous/store_mux.h"
#include "rendezvous/util/describe.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/name_lookup.h"
#include "rendezvous/util/socket_util.h"

namespace dtrun::rendezvous {
namespace {

using asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;
constexpr size_t kChunk = 64 * 1024;
constexpr size_t kMaxUpBacklog = 16u << 20;

struct Downstream {
  Downstream(tcp::socket s, uint32_t n) : sock(std::move(s)), stream(n) {}
  tcp::socket sock;
  uint32_t stream;
  std::string out, sending;  // queued; being written
  bool writing = false, closed = false, paused = false;
  std::unique_ptr<char[]> buf{new char[kChunk]};
};

// A connect to `ai` within the deadline, then the hello both ways. The socket
// on success, -1 with *error otherwise.
int ConnectAndGreet(const addrinfo* ai, SteadyClock::time_point deadline,
                    std::string* error) {
  int fd = sockets::ConnectWithin(ai, deadline, error);
  if (fd < 0) return -1;
  int err = 0;
  std::string got;
  if (::send(fd, kMuxHello.data(), kMuxHello.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(kMuxHello.size())) {
    err = errno;
  }
  while (err == 0 && got.size() < kMuxHello.size()) {
    if (!sockets::PollFor(fd, POLLIN, deadline)) {
      *error = "no answer to the proxy's hello in time";
      break;
    }
    char buf[8];
    ssize_t n = ::recv(fd, buf, kMuxHello.size() - got.size(), 0);
    if (n <= 0) {
      *error = n == 0 ? "it closed the connection at the proxy's hello "
                        "(a store that takes no proxies: an older dtrun?)"
                      : std::strerror(errno);
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  if (err != 0) *error = std::strerror(err);
  if (err == 0 && got == kMuxHello) return fd;
  if (err == 0 && got.size() == kMuxHello.size())
    *error = "it answered the proxy's hello with other bytes";
  ::close(fd);
  return -1;
}

}  // namespace

class StoreProxy::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(const StoreProxyOptions& opts, asio::io_context* io)
      : opts_(opts),
        own_io_(io ? nullptr : new asio::io_context(1)),
        io_(io ? io : own_io_.get()),
        acceptor_(*io_),
        accept_retry_(*io_),
        up_(*io_),
        log_(Logger("dtrun.store")) {}

  Status Connect();
  Status Listen();
  void Begin();
  void ReadUp();
  void OnUp(const asio::error_code& ec, size_t n);
  bool TakeUp(std::string_view* in);
  void Deliver(uint32_t stream, std::string_view bytes);
  void SendUp(MuxType type, uint32_t stream, std::string_view payload);
  void WriteUp();
  void Accept();
  void ReadDown(const std::shared_ptr<Downstream>& d);
  void WriteDown(const std::shared_ptr<Downstream>& d);
  void CloseDown(uint32_t stream, bool tell_store, const char* why);
  void Lost(const std::string& why);
  void CloseAll();

  StoreProxyOptions opts_;
  std::unique_ptr<asio::io_context> own_io_;
  asio::io_context* io_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;  // after a failed accept (EMFILE)
  tcp::socket up_;
  std::string upstream_;  // "host:port" for messages
  uint16_t port_ = 0;
  std::shared_ptr<spdlog::logger> log_;
  std::string up_out_, up_sending_;
  bool up_writing_ = false;
  std::string head_;         // a frame header read in part
  uint32_t cur_stream_ = 0;  // the DATA frame being read
  uint64_t remaining_ = 0;   // its bytes not read yet
  std::unique_ptr<char[]> up_buf_{new char[kChunk]};
  std::unordered_map<uint32_t, std::shared_ptr<Downstream>> downs_;
  std::vector<std::shared_ptr<Downstream>> paused_;
  uint32_t next_stream_ = 1;
  bool lost_ = false;
  std::atomic<bool> stopped_{false};
  std::thread thread_;
  std::atomic<size_t> workers_{0};
  std::atomic<uint64_t> accepted_{0}, writes_up_{0}, frames_up_{0};
  std::atomic<bool> lost_flag_{false};
};

Status StoreProxy::Impl::Connect() {
  upstream_ = opts_.upstream_host + ":" + std::to_string(opts_.upstream_port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai =
      ::getaddrinfo(opts_.upstream_host.c_str(),
                    std::to_string(opts_.upstream_port).c_str(), &hints, &res);
  std::string error = gai != 0 ? std::string("cannot resolve it: ") +
                                     ::gai_strerror(gai) + os::NameLookupHint()
                               : "";
  const auto deadline = SteadyClock::now() + opts_.connect_timeout;
  int fd = -1;
  const addrinfo* used = nullptr;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ConnectAndGreet(ai, deadline, &error);
    used = ai;
  }
  const bool v6 = used && used->ai_family == AF_INET6;
  if (res) ::freeaddrinfo(res);
  if (fd < 0) {
    return Status::Unavailable("store proxy: the workers' store at " +
                               upstream_ + ": " + error);
  }
  asio::error_code ec;
  up_.assign(v6 ? tcp::v6() : tcp::v4(), fd, ec);
  if (!ec) up_.set_option(tcp::no_delay(true), ec);
  if (ec) {
    ::close(fd);
    return Status::Unavailable("store proxy: " + ec.message());
  }
  return Status::Ok();
}

Status StoreProxy::Impl::Listen() {
  asio::error_code ec;
  auto addr = asio::ip::make_address(opts_.listen_host, ec);
  tcp::endpoint ep(addr, opts_.listen_port);
  if (!ec) acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(4096, ec);
  if (ec) {
    return Status::Unavailable(
        "store proxy: cannot listen on " + opts_.listen_host + ":" +
        std::to_string(opts_.listen_port) + ": " + ec.message());
  }
  port_ = acceptor_.local_endpoint().port();
  return Status::Ok();
}

void StoreProxy::Impl::Begin() {
  auto self = shared_from_this();
  asio::post(*io_, [self] {
    self->ReadUp();
    self->Accept();
  });
}

void StoreProxy::Impl::ReadUp() {
  auto self = shared_from_this();
  up_.async_read_some(
      asio::buffer(up_buf_.get(), kChunk),
      [self](const asio::error_code& ec, size_t n) { self->OnUp(ec, n); });
}

void StoreProxy::Impl::OnUp(const asio::error_code& ec, size_t n) {
  if (stopped_ || lost_) return;
  if (ec) {
    Lost(ec == asio::error::eof ? "it closed the connection" : ec.message());
    return;
  }
  std::string_view in(up_buf_.get(), n);
  while (!in.empty()) {
    if (!TakeUp(&in)) return;
  }
  ReadUp();
}

// Consumes the front of `in`: payload bytes of the frame being read, or
// (part of) the next header. False when the stream is broken.
bool StoreProxy::Impl::TakeUp(std::string_view* in) {
  if (remaining_ > 0) {
    size_t take =
        static_cast<size_t>(std::min<uint64_t>(remaining_, in->size()));
    Deliver(cur_stream_, in->substr(0, take));
    in->remove_prefix(take);
    remaining_ -= take;
    return true;
  }
  size_t take = std::min(kMuxHeaderSize - head_.size(), in->size());
  head_.append(in->data(), take);
  in->remove_prefix(take);
  if (head_.size() < kMuxHeaderSize) return true;
  MuxFrame f;
  std::string error;
  if (DecodeMuxHeader(head_, UINT32_MAX, &f, &error) ==
      DecodeState::kMalformed) {
    Lost("a malformed frame from it: " + error);
    return false;
  }
  head_.clear();
  if (f.type == MuxType::kData) {
    cur_stream_ = f.stream;
    remaining_ = f.length;
  } else if (f.type == MuxType::kClose) {
    CloseDown(f.stream, false, "the store closed it");
  } else {
    Lost("it sent an OPEN frame");
    return false;
  }
  return true;
}

void StoreProxy::Impl::Deliver(uint32_t stream, std::string_view bytes) {
  auto it = downs_.find(stream);
  if (it == downs_.end()) return;  // the worker left; its replies go nowhere
  const auto& d = it->second;
  d->out.append(bytes.data(), bytes.size());
  if (d->out.size() + d->sending.size() > opts_.max_worker_backlog) {
    CloseDown(stream, true, "it left too many replies unread");
    return;
  }
  WriteDown(d);
}

void StoreProxy::Impl::SendUp(MuxType type, uint32_t stream,
                              std::string_view payload) {
  PutMuxHeader(&up_out_, type, stream, static_cast<uint32_t>(payload.size()));
  up_out_.append(payload.data(), payload.size());
  ++frames_up_;
  WriteUp();
}

void StoreProxy::Impl::WriteUp() {
  if (up_writing_ || up_out_.empty() || lost_) return;
  up_writing_ = true;
  up_sending_.swap(up_out_);
  ++writes_up_;
  auto self = shared_from_this();
  asio::async_write(up_, asio::buffer(up_sending_),
                    [self](const asio::error_code& ec, size_t) {
                      self->up_writing_ = false;
                      if (self->stopped_ || self->lost_) return;
                      if (ec) {
                        self->Lost(ec.message());
                        return;
                      }
                      self->up_sending_.clear();
                      self->WriteUp();
                      if (self->up_out_.size() > kMaxUpBacklog) return;
                      auto paused = std::move(self->paused_);
                      self->paused_.clear();
                      for (auto& d : paused) {
                        d->paused = false;
                        self->ReadDown(d);
                      }
                    });
}

void StoreProxy::Impl::Accept() {
  auto self = shared_from_this();
  acceptor_.async_accept([self](const asio::error_code& ec, tcp::socket sock) {
    if (ec == asio::error::operation_aborted || self->stopped_ || self->lost_)
      return;
    if (!ec) {
      asio::error_code ignored;
      sock.set_option(tcp::no_delay(true), ignored);
      auto d =
          std::make_shared<Downstream>(std::move(sock), self->next_stream_++);
      self->downs_.emplace(d->stream, d);
      ++self->accepted_;
      self->workers_ = self->downs_.size();
      self->SendUp(MuxType::kOpen, d->stream, {});
      self->ReadDown(d);
      self->Accept();
      return;
    }
    // Out of descriptors and the like: at once again would spin.
    self->log_->warn("store proxy: accept failed: {}; retrying in 50 ms",
                     ec.message());
    self->accept_retry_.expires_after(std::chrono::milliseconds(50));
    self->accept_retry_.async_wait([self](const asio::error_code& e) {
      if (!e && !self->stopped_ && !self->lost_) self->Accept();
    });
  });
}

void StoreProxy::Impl::ReadDown(const std::shared_ptr<Downstream>& d) {
  auto self = shared_from_this();
  d->sock.async_read_some(
      asio::buffer(d->buf.get(), kChunk),
      [self, d](const asio::error_code& ec, size_t n) {
        if (d->closed || self->stopped_) return;
        if (ec) {
          self->CloseDown(d->stream, true, nullptr);
          return;
        }
        self->SendUp(MuxType::kData, d->stream, {d->buf.get(), n});
        if (self->up_out_.size() > kMaxUpBacklog) {
          d->paused = true;
          self->paused_.push_back(d);
          return;
        }
        self->ReadDown(d);
      });
}

void StoreProxy::Impl::WriteDown(const std::shared_ptr<Downstream>& d) {
  if (d->writing || d->out.empty() || d->closed) return;
  d->writing = true;
  d->sending.swap(d->out);
  auto self = shared_from_this();
  asio::async_write(d->sock, asio::buffer(d->sending),
                    [self, d](const asio::error_code& ec, size_t) {
                      d->writing = false;
                      if (d->closed || self->stopped_) return;
                      if (ec) {
                        self->CloseDown(d->stream, true, nullptr);
                        return;
                      }
                      d->sending.clear();
                      self->WriteDown(d);
                    });
}

// `why` is said for a close the worker did not ask for.
void StoreProxy::Impl::CloseDown(uint32_t stream, bool tell_store,
                                 const char* why) {
  auto it = downs_.find(stream);
  if (it == downs_.end()) return;
  auto d = it->second;
  downs_.erase(it);
  workers_ = downs_.size();
  d->closed = true;
  if (why) {
    log_->warn("store proxy: closing a worker's connection (stream {}): {}",
               stream, why);
  }
  asio::error_code ignored;
  d->sock.shutdown(tcp::socket::shutdown_both, ignored);
  d->sock.close(ignored);
  if (tell_store && !lost_) SendUp(MuxType::kClose, stream, {});
}

void StoreProxy::Impl::Lost(const std::string& why) {
  if (lost_) return;
  lost_ = true;
  lost_flag_ = true;
  // With no worker connected, the store's round just ended before ours.
  log_->log(downs_.empty() ? spdlog::level::debug : spdlog::level::err,
            "store proxy: lost the workers' store at {} ({}); closing this "
            "node's {} worker connection(s)",
            upstream_, why, downs_.size());
  CloseAll();
}

void StoreProxy::Impl::CloseAll() {
  asio::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  up_.close(ignored);
  std::vector<uint32_t> streams;
  for (const auto& kv : downs_) streams.push_back(kv.first);
  for (uint32_t s : streams) CloseDown(s, false, nullptr);
  paused_.clear();
}

Result<std::unique_ptr<StoreProxy>> StoreProxy::Start(
    const StoreProxyOptions& options, asio::io_context* io) {
  auto impl = std::make_shared<Impl>(options, io);
  Status s = impl->Connect();
  if (s.ok()) s = impl->Listen();
  if (!s.ok()) return s;
  impl->Begin();
  return std::unique_ptr<StoreProxy>(new StoreProxy(std::move(impl)));
}

StoreProxy::StoreProxy(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreProxy::~StoreProxy() { Stop(); }

uint16_t StoreProxy::port() const { return impl_->port_; }

void StoreProxy::RunInBackground() {
  auto impl = impl_;
  impl_->thread_ = std::thread([impl] { impl->io_->run(); });
}

// The sockets are the loop's: closed there (or here, once no loop runs).
void StoreProxy::Stop() {
  if (impl_->stopped_.exchange(true)) return;
  auto impl = impl_;
  if (impl->io_->stopped() ||
      (!impl->own_io_ ? false : !impl->thread_.joinable())) {
    impl->CloseAll();
  } else {
    std::promise<void> done;
    asio::post(*impl->io_, [impl, &done] {
      impl->CloseAll();
      done.set_value();
    });
    done.get_future().wait();
  }
  if (impl->own_io_) {
    impl->io_->stop();
    if (impl->thread_.joinable()) impl->thread_.join();
  }
}

StoreProxy::Counts StoreProxy::GetCounts() const {
  Counts c;
  c.workers = impl_->workers_;
  c.accepted = impl_->accepted_;
  c.upstream_writes = impl_->writes_up_;
  c.frames_up = impl_->frames_up_;
  c.upstream_lost = impl_->lost_flag_;
  return c;
}

}  // namespace dtrun::rendezvous
