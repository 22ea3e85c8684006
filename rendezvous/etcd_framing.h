#pragma once

// What etcd's JSON gateway sends back, as bytes in and values out, with no
// socket: a reply's head, a sized or chunked body, and a watch stream's
// messages. etcd_client.cc reads a connection into a buffer and hands it
// here; tests/fuzz/etcd_fuzz.cc hands it anything. Every size is bounded,
// so a member (or whatever answers in its place) that sends an endless
// head, a huge length or chunk, or a message that never ends costs an
// error, not memory.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rendezvous/store.h"
#include "rendezvous/util/status.h"

namespace dtrun::rendezvous::etcd_framing {

constexpr size_t kMaxHead = 64 << 10;
constexpr size_t kMaxChunkLine = 1024;
constexpr size_t kMaxBody = size_t{256} << 20;

// What a Take* call made of the buffer: a whole item (consumed from it),
// not yet enough bytes (nothing consumed), or bytes that are not etcd's
// framing (a malformed or oversized reply; the connection is to be dropped).
enum class Took { kItem, kNeedMore, kBad };

struct Head {
  int status = 0;
  bool chunked = false;
  bool keep_alive = true;
  int64_t length = -1;  // Content-Length; -1 when absent
};

// A length or chunk size: digits of `base` (10 or 16) only, blanks around
// them allowed, at most kMaxBody; -1 otherwise, overflow included.
int64_t ParseSize(const std::string& text, int base);

// The status line and headers, up to the blank line.
Took TakeHead(std::string* in, Head* head);
// A sized body (head.length bytes). A head with neither a length nor
// chunks is kBad: etcd never sends one, and it would end only with the
// connection.
Took TakeSizedBody(std::string* in, const Head& head, std::string* body);
// One chunk of a chunked body; *last on the final, empty one (its trailer
// fields consumed with it).
Took TakeChunk(std::string* in, std::string* chunk, bool* last);

// A watched key, with the store's prefix, and the newest revision reported
// for it.
struct WatchedKey {
  std::string key;
  int64_t revision = 0;
};
// Splits the whole lines of a watch stream in `pending` into changes
// (keys without `prefix`), moving each watched key's revision on; a line
// that is not a JSON object is skipped, the rest of a line left for later.
// false when etcd canceled the watch.
bool DrainWatch(std::string* pending, const std::string& prefix,
                std::vector<WatchedKey>* keys, std::vector<KeyChange>* changes);

// Unary replies: the JSON of a 200, read without trusting any field's type
// (the gateway writes int64 as strings and leaves fields at their default
// out; anything else in the way may write anything).
// An int64 field: a string of digits or a number; 0 otherwise.
int64_t IntField(const nlohmann::json& o, const char* key);
// A string field; "" otherwise.
std::string StrField(const nlohmann::json& o, const char* key);
// A boolean field; false otherwise.
bool BoolField(const nlohmann::json& o, const char* key);

// A key's value and revisions, as a range returns them.
struct Kv {
  bool found = false;
  std::string value;  // decoded from base64 ("" when it is not base64)
  int64_t mod_revision = 0;
  int64_t version = 0;
};
// The first key-value of a /v3/kv/range reply, or of a txn's range
// response (`response_range` inside).
Kv FirstKv(const nlohmann::json& range);
// Every key-value of a /v3/kv/range reply over a range, by key, and the
// reply's revision.
Status DecodeRangeAll(const nlohmann::json& reply,
                      std::map<std::string, Kv>* out, int64_t* revision);
// A txn of `n` range requests: each one's first key-value, and the reply's
// revision. Invalid unless the reply holds exactly `n` responses.
Status DecodeRanges(const nlohmann::json& reply, size_t n, std::vector<Kv>* out,
                    int64_t* revision);

}  // namespace dtrun::rendezvous::etcd_framing

namespace dtrun::rendezvous {

// Base64 as the gateway carries bytes.
std::string Base64Encode(std::string_view bytes);
bool Base64Decode(std::string_view text, std::string* bytes);

}  // namespace dtrun::rendezvous
