// libFuzzer target for what an etcd member (or whatever answers in its
// place) sends dtrun: a reply's framing (head, sized or chunked body with
// trailers), a watch stream's messages, and the JSON of unary replies
// through every decoder the store uses. The input is the byte stream; its
// first byte picks how many bytes arrive at a time, so that a reply split
// anywhere decodes as the whole one does. Each must accept any bytes
// without crashing, throwing or growing past its bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "rendezvous/etcd_framing.h"

namespace f = dtrun::rendezvous::etcd_framing;

namespace {

struct Outcome {
  f::Took took = f::Took::kNeedMore;
  f::Head head;
  std::string body;
  std::vector<dtrun::rendezvous::KeyChange> changes;
  bool canceled = false;
};

// Reads the stream as etcd_client.cc reads a connection: a head, then a
// sized body, or chunks whose lines are watch messages.
Outcome Read(const std::string& bytes, size_t step) {
  Outcome o;
  std::string in, pending;
  size_t fed = 0;
  auto more = [&] {
    if (fed >= bytes.size()) return false;
    in.append(bytes, fed, step);
    fed += step;
    return true;
  };
  while ((o.took = f::TakeHead(&in, &o.head)) == f::Took::kNeedMore)
    if (!more()) return o;
  if (in.size() > f::kMaxHead + step + 4) std::abort();
  if (o.took == f::Took::kBad) return o;
  if (!o.head.chunked) {
    while ((o.took = f::TakeSizedBody(&in, o.head, &o.body)) ==
           f::Took::kNeedMore)
      if (!more()) return o;
    return o;
  }
  std::vector<f::WatchedKey> keys{{"/dtrun/a", 0}};
  for (;;) {
    std::string chunk;
    bool last = false;
    while ((o.took = f::TakeChunk(&in, &chunk, &last)) == f::Took::kNeedMore)
      if (!more()) return o;
    if (o.took == f::Took::kBad || last) return o;
    if (chunk.size() > f::kMaxBody) std::abort();
    o.body += chunk;
    pending += chunk;
    if (!f::DrainWatch(&pending, "/dtrun/", &keys, &o.changes)) {
      o.canceled = true;
      return o;
    }
    if (pending.find('\n') != std::string::npos) std::abort();
  }
}

// The JSON of a unary reply through each decoder.
void Decode(const std::string& text) {
  auto json = nlohmann::json::parse(text, nullptr, false);
  std::vector<f::Kv> kvs;
  int64_t revision = 0;
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}}) {
    if (f::DecodeRanges(json, n, &kvs, &revision).ok() && kvs.size() != n)
      std::abort();
  }
  f::Kv kv = f::FirstKv(json);
  if (!kv.found && (!kv.value.empty() || kv.version != 0)) std::abort();
  (void)f::IntField(json, "deleted");
  (void)f::StrField(json, "token");
  (void)f::BoolField(json, "succeeded");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = 1 + data[0] % 64;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  Outcome whole = Read(bytes, bytes.size() + 1);
  Outcome split = Read(bytes, step);
  // However the bytes arrive, the same reply (or the same refusal).
  if (whole.took != split.took || whole.body != split.body ||
      whole.changes.size() != split.changes.size() ||
      whole.canceled != split.canceled)
    std::abort();
  Decode(whole.body);
  Decode(bytes);
  return 0;
}
