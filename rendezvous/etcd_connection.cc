// The etcd member connection's operations (etcd_connection.h).
#include "rendezvous/etcd_connection.h"

#include <condition_variable>
#include <thread>

#include "rendezvous/util/name_lookup.h"

namespace dtrun::rendezvous {
namespace framing = etcd_framing;
using std::chrono::milliseconds;

// An asio error for people: the timeouts Run reports read as what they
// mean for a member ("no answer in time"), a reply past the bounds above as
// such, the rest as the system says.
std::string DescribeEtcdError(const asio::error_code& ec) {
  if (ec == asio::error::timed_out || ec == asio::error::would_block)
    return "no answer in time";
  if (ec == asio::error::message_size)
    return "reply malformed or too large (a head over 64 KiB, a length or "
           "chunk over 256 MiB)";
  if (ec.category() == asio::error::get_netdb_category())
    return ec.message() + os::NameLookupHint();
  return ec.message();
}

// Resolves, connects and, for TLS, shakes hands verifying the member's
// certificate against the host name or address it was named by.
asio::error_code EtcdConnection::Open(TimePoint deadline) {
  asio::ip::tcp::resolver::results_type found;
  asio::error_code ec = Resolve(deadline, &found);
  if (ec) return ec;
  ec = Run(deadline, POLLOUT, [&](auto done) {
    asio::async_connect(socket_, found,
                        [done](asio::error_code e, const auto&) { done(e); });
  });
  if (ec || !tls_) return ec;
  tls_->set_verify_mode(asio::ssl::verify_peer);
  tls_->set_verify_callback(asio::ssl::host_name_verification(host_));
  // SNI, for members behind a name
  SSL_set_tlsext_host_name(tls_->native_handle(), host_.c_str());
  return Run(deadline, POLLIN | POLLOUT, [&](auto done) {
    tls_->async_handshake(asio::ssl::stream_base::client,
                          [done](asio::error_code e) { done(e); });
  });
}

// The member's addresses, by the deadline. getaddrinfo cannot be
// interrupted, and a name server that does not answer holds it for
// timeout x attempts of resolv.conf (tens of seconds), so it runs on a
// thread of its own that this waits for until the deadline only; one
// that is late finishes alone and its answer is dropped.
asio::error_code EtcdConnection::Resolve(
    TimePoint deadline, asio::ip::tcp::resolver::results_type* found) {
  asio::error_code numeric;
  const auto address = asio::ip::make_address(host_, numeric);
  if (!numeric) {  // an address needs no name server, and no thread
    *found = asio::ip::tcp::resolver::results_type::create(
        asio::ip::tcp::endpoint(address, port_), host_, std::to_string(port_));
    return {};
  }
  struct Lookup {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    asio::error_code ec;
    asio::ip::tcp::resolver::results_type found;
  };
  auto lookup = std::make_shared<Lookup>();
  std::thread([lookup, host = host_, port = std::to_string(port_)] {
    asio::io_context io;  // a resolver needs one; this thread's own
    asio::ip::tcp::resolver resolver(io);
    asio::error_code ec;
    auto addresses = resolver.resolve(host, port, ec);
    std::lock_guard<std::mutex> lock(lookup->mu);
    lookup->ec = ec;
    lookup->found = std::move(addresses);
    lookup->done = true;
    lookup->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(lookup->mu);
  if (!lookup->cv.wait_until(lock, deadline, [&] { return lookup->done; }))
    return asio::error::timed_out;
  *found = lookup->found;
  return lookup->ec;
}

// Sends one POST; the reply's head is read by ReadHead.
asio::error_code EtcdConnection::Send(const std::string& path,
                                      const std::string& body,
                                      TimePoint deadline) {
  out_ = "POST " + path + " HTTP/1.1\r\nHost: " + host_ + ":" +
         std::to_string(port_) +
         (token_.empty() ? "" : "\r\nAuthorization: " + token_) +
         "\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
  return Run(deadline, POLLOUT, [&](auto done) {
    auto handler = [done](asio::error_code e, size_t) { done(e); };
    if (tls_) {
      asio::async_write(*tls_, asio::buffer(out_), handler);
    } else {
      asio::async_write(socket_, asio::buffer(out_), handler);
    }
  });
}

// Reads the status line and headers; the body follows through ReadBody
// (sized or chunked) or NextChunk (streams).
asio::error_code EtcdConnection::ReadHead(TimePoint deadline, int* status) {
  auto ec = Take(deadline, asio::error::message_size,
                 [&] { return framing::TakeHead(&in_, &head_); });
  if (!ec) *status = head_.status;
  return ec;
}

// A unary reply's body.
asio::error_code EtcdConnection::ReadBody(TimePoint deadline,
                                          std::string* body) {
  body->clear();
  if (!head_.chunked) {
    return Take(deadline, asio::error::invalid_argument,
                [&] { return framing::TakeSizedBody(&in_, head_, body); });
  }
  for (;;) {
    std::string chunk;
    bool last = false;
    if (auto ec = NextChunk(deadline, &chunk, &last)) return ec;
    if (last) return {};
    if (body->size() + chunk.size() > framing::kMaxBody)
      return asio::error::message_size;
    *body += chunk;
  }
}

// One chunk of a chunked body; *last on the final (empty) one.
asio::error_code EtcdConnection::NextChunk(TimePoint deadline,
                                           std::string* chunk, bool* last) {
  return Take(deadline, asio::error::message_size,
              [&] { return framing::TakeChunk(&in_, chunk, last); });
}

// Whether a read would not block: bytes buffered here or in TLS, or the
// socket readable (data, end of stream or an error). Waits for that up to
// `deadline` (default: not at all) without touching the stream.
bool EtcdConnection::Readable(TimePoint deadline) {
  if (!in_.empty()) return true;
  if (!socket_.is_open()) return true;
  if (tls_ && SSL_pending(tls_->native_handle()) > 0) return true;
  auto left =
      std::chrono::duration_cast<milliseconds>(deadline - SteadyClock::now());
  (void)left;
  return sockets::PollFor(socket_.native_handle(), POLLIN, deadline);
}

std::string EtcdConnection::LocalAddress() {
  asio::error_code ec;
  auto local = socket_.local_endpoint(ec);
  return ec ? "" : local.address().to_string();
}

// Appends what the socket has (at least one byte) to in_; the end of the
// stream is an error here, as every reply is framed.
asio::error_code EtcdConnection::ReadMore(TimePoint deadline) {
  char buf[16384];
  size_t got = 0;
  auto ec = Run(deadline, tls_ ? POLLIN | POLLOUT : POLLIN, [&](auto done) {
    auto handler = [done, &got](asio::error_code e, size_t n) {
      got = n;
      done(e);
    };
    if (tls_) {
      tls_->async_read_some(asio::buffer(buf), handler);
    } else {
      socket_.async_read_some(asio::buffer(buf), handler);
    }
  });
  in_.append(buf, got);
  if (!ec && got == 0) ec = asio::error::eof;
  return ec;
}

void EtcdConnection::RunHooked(TimePoint deadline, short events,
                               const bool* finished) {
  for (;;) {
    io_.poll();
    if (*finished || SteadyClock::now() >= deadline) return;
    io_.restart();
    const int fd = socket_.native_handle();
    if (fd < 0) {
      sockets::SleepUntil(
          std::min(deadline, SteadyClock::now() + milliseconds(1)));
    } else {
      (void)sockets::PollFor(fd, events, deadline);
    }
  }
}

}  // namespace dtrun::rendezvous
