#pragma once

// The server's insides, shared by store_server.cc (sockets, requests) and
// store_server_mux.cc (a proxy's multiplexed connection). Private to the
// server: not installed.

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <asio.hpp>

#include "rendezvous/store_mux.h"
#include "rendezvous/store_server.h"
#include "rendezvous/store_state.h"
#include "rendezvous/util/log.h"

namespace dtrun::rendezvous {

inline constexpr size_t kReadChunk = 64 * 1024;
inline constexpr int kSendBufferBytes = 192 << 10;  // the kernel doubles it
using asio::ip::tcp;

inline std::string FormatEndpoint(const tcp::endpoint& ep) {
  std::string addr = ep.address().to_string();
  if (ep.address().is_v6()) addr = "[" + addr + "]";
  return addr + ":" + std::to_string(ep.port());
}

// Reply bytes queued for a connection: owned, or a stored value shared with
// the store (sent without a copy).
struct Segment {
  std::string bytes;
  std::shared_ptr<const std::string> shared;
  std::string_view view() const {
    return shared ? std::string_view(*shared) : bytes;
  }
};

// One client connection. Owned by Impl::sessions_ and by in-flight handlers;
// touched only on the loop thread.
struct Session : std::enable_shared_from_this<Session> {
  Session(tcp::socket s, ConnId conn_id) : socket(std::move(s)), id(conn_id) {}

  tcp::socket socket;
  ConnId id;
  std::string peer;
  Dialect dialect = Dialect::kUnknown;
  uint64_t requests = 0;  // requests decoded so far
  std::string in;         // received bytes; in[in_off..] not yet decoded
  size_t in_off = 0;
  size_t need = 1;          // decode again once this many bytes are buffered
  std::deque<Segment> out;  // replies not yet handed to the kernel
  size_t out_off = 0;       // bytes of out.front() already sent
  bool write_busy = false;  // waiting for the socket to take more
  bool read_busy = false;
  bool dirty = false;  // listed in Impl::dirty_
  bool closed = false;
  std::unique_ptr<char[]> buf{new char[kReadChunk]};

  // Multiplexed connections (store_mux.h). A proxy's connection, once its
  // hello arrived, holds frames in `in` and its streams by number; a stream
  // has no socket (its replies are framed into its parent's output) and is
  // closed before its parent.
  bool mux = false;
  std::unordered_map<uint32_t, ConnId> streams;  // of a mux connection
  Session* parent = nullptr;                     // of a stream
  uint32_t stream = 0;                           // its number there
  bool sub() const { return parent != nullptr; }
};

class StoreServer::Impl : public ReplySink {
 public:
  explicit Impl(const StoreServerOptions& opts)
      : opts_(opts), log_(Logger("dtrun.store")) {}

  Status Listen();
  void Accept();
  void StartRead(const std::shared_ptr<Session>& s);
  void OnRead(const std::shared_ptr<Session>& s, const asio::error_code& ec,
              size_t n);
  bool Process(Session* s);
  bool ProcessRequests(Session* s);
  // Multiplexed connections (store_server_mux.cc).
  bool StartMux(Session* s, std::string_view avail);
  bool ProcessMux(Session* s);
  bool OnMuxFrame(Session* s, const MuxFrame& f, std::string_view payload);
  void FrameStream(Session* s);
  void CloseStream(Session* s, const std::string& reason, bool tell_proxy);
  static void CompactInput(Session* s);
  void StartWrite(const std::shared_ptr<Session>& s);
  bool WriteNow(Session* s);
  static size_t Pending(const Session& s);
  void FlushDirty();
  void Close(Session* s, const std::string& reason);
  Session* Dirty(ConnId conn);
  std::string* Out(ConnId conn) override;
  void OutShared(ConnId conn,
                 std::shared_ptr<const std::string> bytes) override;
  void CloseAll();
  template <typename Fn>
  auto OnLoop(Fn fn) -> decltype(fn());

  StoreServerOptions opts_;
  std::shared_ptr<spdlog::logger> log_;
  asio::io_context io_{1};  // one thread runs it: lets asio skip some locking
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_retry_{io_};
  std::string host_;
  uint16_t port_ = 0;
  StoreState state_;
  uint64_t requests_ = 0;  // every request decoded, on the loop thread
  std::unordered_map<ConnId, std::shared_ptr<Session>> sessions_;
  std::vector<std::shared_ptr<Session>> dirty_;
  ConnId next_id_ = 1;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace dtrun::rendezvous
