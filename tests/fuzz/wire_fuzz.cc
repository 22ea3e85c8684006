// libFuzzer target: arbitrary bytes as a connection's stream, decoded frame by
// frame (dialect chosen from the first bytes, as the server does) and applied
// to a StoreState; bytes that start with a proxy's hello (store_mux.h) are
// its frames instead, each stream's DATA decoded as a connection of its
// own. Must never crash, hang, or allocate from an unchecked length.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <map>
#include <string>

#include "rendezvous/store_mux.h"
#include "rendezvous/store_state.h"
#include "rendezvous/wire.h"

namespace {

class NullSink : public dtrun::rendezvous::ReplySink {
 public:
  std::string* Out(dtrun::rendezvous::ConnId) override {
    out.clear();
    return &out;
  }
  std::string out;
};

using namespace dtrun::rendezvous;

WireLimits Limits() {
  WireLimits limits;
  limits.max_value_bytes = 1 << 16;
  limits.max_key_bytes = 1 << 12;
  limits.max_keys = 64;
  return limits;
}

// A proxy's frames: each stream's bytes decoded as its own connection's.
void Mux(std::string_view in) {
  StoreState state;
  NullSink sink;
  std::map<uint32_t, std::string> streams;
  while (true) {
    MuxFrame f;
    std::string error;
    if (DecodeMuxHeader(in, 1 << 20, &f, &error) != DecodeState::kDone ||
        in.size() < kMuxHeaderSize + f.length)
      break;
    std::string& buf = streams[f.stream];
    buf.append(in.substr(kMuxHeaderSize, f.length));
    in.remove_prefix(kMuxHeaderSize + f.length);
    Dialect d = DetectDialect(buf);
    while (d != Dialect::kUnknown && !buf.empty()) {
      Request req;
      size_t consumed = 0;
      if (DecodeRequest(buf, d, Limits(), &req, &consumed, &error) !=
          DecodeState::kDone)
        break;
      buf.erase(0, consumed);
      if (!state.Apply(f.stream, req, &sink).ok()) {
        state.Disconnect(f.stream, &sink);
        buf.clear();
      }
    }
    if (f.type == MuxType::kClose) state.Disconnect(f.stream, &sink);
  }
  for (const auto& kv : streams) state.Disconnect(kv.first, &sink);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (in.substr(0, kMuxHello.size()) == kMuxHello) {
    Mux(in.substr(kMuxHello.size()));
    return 0;
  }
  Dialect dialect = DetectDialect(in);
  if (dialect == Dialect::kUnknown) return 0;
  const WireLimits limits = Limits();
  StoreState state;
  NullSink sink;
  size_t pos = 0;
  ConnId conn = 1;
  while (pos < in.size()) {
    Request req;
    size_t consumed = 0;
    std::string error;
    DecodeState st =
        DecodeRequest(in.substr(pos), dialect, limits, &req, &consumed, &error);
    if (st != DecodeState::kDone) break;
    pos += consumed;
    // Alternate connections so waiters on one are released by another.
    if (!state.Apply(conn, req, &sink).ok()) state.Disconnect(conn, &sink);
    conn = conn % 3 + 1;
  }
  state.Disconnect(1, &sink);
  state.Disconnect(2, &sink);
  state.Disconnect(3, &sink);
  return 0;
}
