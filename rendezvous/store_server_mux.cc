// A node's proxy connection (store_mux.h) inside the server. Each stream is
// a Session without a socket: its bytes are fed to the same request path as
// a real connection's (dialect, limits, malformed -> closed alone), and its
// replies, collected in its own output queue as usual, are framed into the
// parent's queue when the loop flushes (FrameStream), shared value buffers
// included, so a proxied GET of a large value is not copied either. The
// parent's backpressure holds every stream of that node; a stream's close,
// either side's, is a CLOSE frame, and closing the parent closes its streams
// first (their on-close ADDs run as for connections that dropped).

#include "rendezvous/store_server_impl.h"

namespace dtrun::rendezvous {
namespace {

// A proxy sends a worker's bytes in chunks of one read (64 KiB); a frame
// above this is not from one.
constexpr uint32_t kMaxProxyFrame = 1u << 20;
// One DATA frame carries at most this much of a stream's replies (several
// frames follow for more: the length field is 32 bits).
constexpr size_t kMaxReplyFrame = 1u << 30;

}  // namespace

// The hello may arrive in pieces; a first byte of 0xD7 followed by anything
// else is left to the request decoder, which names it malformed.
bool StoreServer::Impl::StartMux(Session* s, std::string_view avail) {
  if (avail.size() < kMuxHello.size()) {
    if (avail != kMuxHello.substr(0, avail.size())) return ProcessRequests(s);
    s->need = kMuxHello.size();
    return true;
  }
  if (avail.substr(0, kMuxHello.size()) != kMuxHello) return ProcessRequests(s);
  s->in_off += kMuxHello.size();
  s->mux = true;
  s->need = kMuxHeaderSize;
  Out(s->id)->append(kMuxHello);
  log_->debug("connection {} from {} is a node's proxy", s->id, s->peer);
  return ProcessMux(s);
}

// Whole frames only: a DATA frame is handed on once all of it is here.
bool StoreServer::Impl::ProcessMux(Session* p) {
  while (p->in.size() - p->in_off >= p->need) {
    std::string_view avail(p->in.data() + p->in_off, p->in.size() - p->in_off);
    MuxFrame f;
    std::string error;
    if (DecodeMuxHeader(avail, kMaxProxyFrame, &f, &error) ==
        DecodeState::kMalformed) {
      Close(p, "malformed proxy frame: " + error);
      return false;
    }
    const size_t size = kMuxHeaderSize + f.length;
    if (avail.size() < size) {
      p->need = size;
      break;
    }
    p->in_off += size;
    p->need = kMuxHeaderSize;
    if (!OnMuxFrame(p, f, avail.substr(kMuxHeaderSize, f.length))) return false;
  }
  CompactInput(p);
  return true;
}

// False when the parent was closed. DATA for a stream this side has closed
// (its bytes were on the way) is dropped.
bool StoreServer::Impl::OnMuxFrame(Session* p, const MuxFrame& f,
                                   std::string_view payload) {
  auto it = p->streams.find(f.stream);
  switch (f.type) {
    case MuxType::kOpen: {
      if (it != p->streams.end()) {
        Close(p, "stream " + std::to_string(f.stream) + " opened twice");
        return false;
      }
      auto sub = std::make_shared<Session>(tcp::socket(io_), next_id_++);
      sub->parent = p;
      sub->stream = f.stream;
      sub->peer = p->peer + " stream " + std::to_string(f.stream);
      sessions_.emplace(sub->id, sub);
      p->streams.emplace(f.stream, sub->id);
      return true;
    }
    case MuxType::kData: {
      if (it == p->streams.end()) return true;
      std::shared_ptr<Session> sub = sessions_.at(it->second);
      sub->in.append(payload.data(), payload.size());
      if (sub->in.size() - sub->in_off >= sub->need) Process(sub.get());
      return !p->closed;
    }
    case MuxType::kClose:
      if (it != p->streams.end()) {
        CloseStream(sessions_.at(it->second).get(), "", false);
      }
      return true;
  }
  return true;
}

// The stream's queued replies go to its parent as DATA frames, segments
// moved, not copied.
void StoreServer::Impl::FrameStream(Session* s) {
  Session* p = s->parent;
  if (p->closed) {
    s->out.clear();
    return;
  }
  while (!s->out.empty()) {
    size_t n = 0, k = 0;
    while (k < s->out.size() &&
           (k == 0 || n + s->out[k].view().size() <= kMaxReplyFrame)) {
      n += s->out[k++].view().size();
    }
    if (n > 0) {
      PutMuxHeader(Out(p->id), MuxType::kData, s->stream,
                   static_cast<uint32_t>(n));
    }
    for (size_t i = 0; i < k; ++i) {
      if (!s->out.front().view().empty())
        p->out.push_back(std::move(s->out.front()));
      s->out.pop_front();
    }
  }
  s->out_off = 0;
}

// Like Close for a connection: the state forgets the stream (its on-close
// ADD runs); the proxy is told unless it closed the stream itself.
void StoreServer::Impl::CloseStream(Session* s, const std::string& reason,
                                    bool tell_proxy) {
  if (s->closed) return;
  s->closed = true;
  if (!reason.empty()) {
    log_->warn("closing connection from {}: {}", s->peer, reason);
  }
  state_.Disconnect(s->id, this);
  Session* p = s->parent;
  p->streams.erase(s->stream);
  if (tell_proxy && !p->closed) {
    PutMuxHeader(Out(p->id), MuxType::kClose, s->stream, 0);
  }
  sessions_.erase(s->id);  // may drop the last owner: touch nothing after
}

}  // namespace dtrun::rendezvous
