// libFuzzer target: arbitrary bytes as a connection's stream, decoded frame by
// frame (dialect chosen from the first bytes, as the server does) and applied
// to a StoreState. Must never crash, hang, or allocate from an unchecked
// length.
#include <cstddef>
#include <cstdint>
#include <string_view>

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrun::rendezvous;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  Dialect dialect = DetectDialect(in);
  if (dialect == Dialect::kUnknown) return 0;
  WireLimits limits;
  limits.max_value_bytes = 1 << 16;
  limits.max_key_bytes = 1 << 12;
  limits.max_keys = 64;
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
