#pragma once

// One HTTP/1.1 keep-alive connection to one etcd member, over asio, plain
// or TLS: each operation bounded by a deadline run on the client's
// io_context (start the operation, run the context until the deadline,
// close the socket when it is passed). The bytes are read by etcd_framing;
// EtcdClient and EtcdWatch (etcd_client.h) own the connections. Only
// rendezvous/etcd_client.cc includes this (it brings in asio).

#include <poll.h>

#include <asio.hpp>
#include <asio/ssl.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "rendezvous/etcd_framing.h"
#include "rendezvous/util/socket_util.h"

namespace dtrun::rendezvous {

// An asio error for people: the timeouts Run reports read as what they
// mean for a member ("no answer in time"), a reply past the framing's
// bounds as such, the rest as the system says.
std::string DescribeEtcdError(const asio::error_code& ec);

class EtcdConnection {
 public:
  using SteadyClock = std::chrono::steady_clock;
  using TimePoint = SteadyClock::time_point;

  // `io` is the client's, shared by its connections (an io_context holds
  // two descriptors: thousands of nodes' watches would run out of them);
  // `io_mu` serializes its use.
  EtcdConnection(std::string host, uint16_t port, asio::ssl::context* tls,
                 asio::io_context& io, std::mutex& io_mu)
      : host_(std::move(host)),
        port_(port),
        io_(io),
        io_mu_(io_mu),
        socket_(io) {
    if (tls) tls_ = std::make_unique<TlsStream>(socket_, *tls);
  }

  // Resolves, connects and, for TLS, shakes hands verifying the member's
  // certificate against the host name or address it was named by.
  asio::error_code Open(TimePoint deadline);
  // Sends one POST; the reply's head is read by ReadHead.
  asio::error_code Send(const std::string& path, const std::string& body,
                        TimePoint deadline);
  // Reads the status line and headers; the body follows through ReadBody
  // (sized or chunked) or NextChunk (streams).
  asio::error_code ReadHead(TimePoint deadline, int* status);
  // A unary reply's body.
  asio::error_code ReadBody(TimePoint deadline, std::string* body);
  // One chunk of a chunked body; *last on the final (empty) one.
  asio::error_code NextChunk(TimePoint deadline, std::string* chunk,
                             bool* last);

  bool reusable() const { return head_.keep_alive && socket_.is_open(); }
  // etcd's auth token, sent with each request from now on ("": none).
  void set_token(std::string token) { token_ = std::move(token); }
  // Whether a read would not block: bytes buffered here or in TLS, or the
  // socket readable (data, end of stream or an error). Waits for that up to
  // `deadline` (default: not at all) without touching the stream.
  bool Readable(TimePoint deadline = TimePoint());
  const std::string& host() const { return host_; }
  std::string LocalAddress();

 private:
  using TlsStream = asio::ssl::stream<asio::ip::tcp::socket&>;

  // The member's addresses, by the deadline (on a thread of its own).
  asio::error_code Resolve(TimePoint deadline,
                           asio::ip::tcp::resolver::results_type* found);
  // Calls `take` (a framing::Take* on in_) until it takes a whole item,
  // reading more while it needs more; bytes it refuses are `bad`.
  template <typename TakeFn>
  asio::error_code Take(TimePoint deadline, asio::error_code bad, TakeFn take) {
    for (;;) {
      switch (take()) {
        case etcd_framing::Took::kItem:
          return {};
        case etcd_framing::Took::kBad:
          return bad;
        case etcd_framing::Took::kNeedMore:
          if (auto ec = ReadMore(deadline)) return ec;
      }
    }
  }

  // Appends what the socket has (at least one byte) to in_; the end of the
  // stream is an error here, as every reply is framed.
  asio::error_code ReadMore(TimePoint deadline);
  // Starts an operation and runs the context until it completes or the
  // deadline passes; then the socket is closed (the operation completes
  // with an error) and timed_out returned. `events` (POLLIN, POLLOUT): what
  // the operation waits for, where this thread's waits are hooked
  // (sockets::WaitHooked: an event loop runs many connections on it).
  template <typename Start>
  asio::error_code Run(TimePoint deadline, short events, Start start) {
    std::lock_guard<std::mutex> lock(io_mu_);
    asio::error_code result = asio::error::would_block;
    bool finished = false;
    start([&result, &finished](asio::error_code ec) {
      result = ec;
      finished = true;
    });
    io_.restart();
    if (sockets::WaitHooked()) {
      RunHooked(deadline, events, &finished);
    } else {
      io_.run_until(deadline);
    }
    if (!finished) {
      asio::error_code ignored;
      socket_.close(ignored);
      io_.restart();
      io_.run();
      return asio::error::timed_out;
    }
    if (result) {
      asio::error_code ignored;
      socket_.close(ignored);
    }
    return result;
  }
  // Run's loop where waits are hooked: the context's ready handlers, then a
  // wait for the socket through sockets::PollFor, until `*finished`.
  void RunHooked(TimePoint deadline, short events, const bool* finished);

  std::string host_;
  uint16_t port_;
  asio::io_context& io_;
  std::mutex& io_mu_;
  asio::ip::tcp::socket socket_;
  std::unique_ptr<TlsStream> tls_;
  std::string token_;
  std::string out_, in_;
  etcd_framing::Head head_;  // the last reply's
};

}  // namespace dtrun::rendezvous
