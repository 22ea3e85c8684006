// The gateway's framing: HTTP/1.1 replies (RFC 9112: a status line,
// headers, then a body sized by Content-Length or sent in chunks) and a
// watch's endless chunked stream of one JSON message per line. Each Take*
// looks at the buffer's front and consumes exactly one item or nothing.
#include "rendezvous/etcd_framing.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <nlohmann/json.hpp>

namespace dtrun::rendezvous::etcd_framing {
namespace {

// Header names are case-insensitive (RFC 9110); etcd's Go server writes
// them capitalized, proxies may not.
std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(c));
  return s;
}

// A status line "HTTP/1.x NNN ...": the code, or -1.
int StatusOf(const std::string& head) {
  if (head.compare(0, 5, "HTTP/") != 0 || head.size() < 12 || head[8] != ' ')
    return -1;
  int code = 0;
  for (size_t i = 9; i < 12; ++i) {
    if (head[i] < '0' || head[i] > '9') return -1;
    code = code * 10 + (head[i] - '0');
  }
  return code;
}

}  // namespace

int64_t ParseSize(const std::string& text, int base) {
  size_t i = text.find_first_not_of(" \t");
  size_t j = text.find_last_not_of(" \t");
  if (i == std::string::npos) return -1;
  int64_t value = 0;
  for (size_t k = i; k <= j; ++k) {
    const char c = static_cast<char>(std::tolower(text[k]));
    int digit = c >= '0' && c <= '9'                 ? c - '0'
                : base == 16 && c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                     : -1;
    if (digit < 0) return -1;
    value = value * base + digit;
    if (value > static_cast<int64_t>(kMaxBody)) return -1;
  }
  return value;
}

// Only the fields the client acts on are read: the status, how the body is
// framed, and whether the member keeps the connection. A head is taken
// whole or not at all, so a caller that reads more and calls again never
// sees half of one.
Took TakeHead(std::string* in, Head* head) {
  const size_t end = in->find("\r\n\r\n");
  if (end == std::string::npos)
    return in->size() > kMaxHead ? Took::kBad : Took::kNeedMore;
  if (end > kMaxHead) return Took::kBad;
  const std::string text = in->substr(0, end);
  Head h;
  h.status = StatusOf(text);
  if (h.status < 0) return Took::kBad;
  size_t pos = text.find("\r\n");
  while (pos != std::string::npos) {
    size_t next = text.find("\r\n", pos + 2);
    std::string line = Lower(text.substr(pos + 2, next - pos - 2));
    if (line.rfind("content-length:", 0) == 0) {
      h.length = ParseSize(line.substr(15), 10);
      if (h.length < 0) return Took::kBad;
    }
    if (line.rfind("transfer-encoding:", 0) == 0 &&
        line.find("chunked") != std::string::npos)
      h.chunked = true;
    if (line.rfind("connection:", 0) == 0 &&
        line.find("close") != std::string::npos)
      h.keep_alive = false;
    pos = next;
  }
  in->erase(0, end + 4);
  *head = h;
  return Took::kItem;
}

// The length was bounded when the head was taken (ParseSize), so waiting
// for it can cost at most kMaxBody bytes of buffer.
Took TakeSizedBody(std::string* in, const Head& head, std::string* body) {
  if (head.chunked || head.length < 0) return Took::kBad;
  const size_t n = static_cast<size_t>(head.length);
  if (in->size() < n) return Took::kNeedMore;
  body->assign(*in, 0, n);
  in->erase(0, n);
  return Took::kItem;
}

// A chunk is "<hex size>[;ext]\r\n<data>\r\n"; the data must end with the
// CRLF, or the stream is out of step with its framing and nothing after it
// can be trusted.
Took TakeChunk(std::string* in, std::string* chunk, bool* last) {
  const size_t eol = in->find("\r\n");
  if (eol == std::string::npos)
    return in->size() > kMaxChunkLine ? Took::kBad : Took::kNeedMore;
  if (eol > kMaxChunkLine) return Took::kBad;
  // The size, up to a chunk extension (";name=value"), hex digits only.
  const int64_t parsed =
      ParseSize(in->substr(0, std::min(eol, in->find(';'))), 16);
  if (parsed < 0) return Took::kBad;
  const size_t size = static_cast<size_t>(parsed);
  if (size == 0) {
    // The last chunk, then trailer fields up to a blank line (etcd's
    // gateway sends Grpc-Trailer-Content-Type after an error).
    const size_t end = in->find("\r\n\r\n", eol);
    if (end == std::string::npos)
      return in->size() > kMaxHead ? Took::kBad : Took::kNeedMore;
    if (end - eol > kMaxHead) return Took::kBad;
    chunk->clear();
    in->erase(0, end + 4);
    *last = true;
    return Took::kItem;
  }
  if (in->size() < eol + 2 + size + 2) return Took::kNeedMore;
  if (in->compare(eol + 2 + size, 2, "\r\n") != 0) return Took::kBad;
  chunk->assign(*in, eol + 2, size);
  in->erase(0, eol + 2 + size + 2);
  *last = false;
  return Took::kItem;
}

// The gateway writes each watch response as one JSON object on its own
// line, wrapped in {"result": ...}; a PUT's event has no "type" (its
// default), a DELETE says so, and version 1 marks a key's creation. A key
// the watch did not ask for still moves nothing but its own change.
bool DrainWatch(std::string* pending, const std::string& prefix,
                std::vector<WatchedKey>* keys,
                std::vector<KeyChange>* changes) {
  size_t eol;
  while ((eol = pending->find('\n')) != std::string::npos) {
    auto msg = nlohmann::json::parse(pending->substr(0, eol), nullptr, false);
    pending->erase(0, eol + 1);
    if (!msg.is_object()) continue;
    const auto it = msg.find("result");
    const nlohmann::json& result = it != msg.end() ? *it : msg;
    if (!result.is_object()) continue;
    if (BoolField(result, "canceled")) return false;
    const auto events = result.find("events");
    if (events == result.end() || !events->is_array()) continue;
    for (const auto& ev : *events) {
      if (!ev.is_object()) continue;
      const auto kv = ev.find("kv");
      if (kv == ev.end() || !kv->is_object()) continue;
      std::string key;
      if (!Base64Decode(StrField(*kv, "key"), &key) || key.empty()) continue;
      const int64_t revision = IntField(*kv, "mod_revision");
      for (WatchedKey& k : *keys)
        if (k.key == key) k.revision = std::max(k.revision, revision);
      KeyChange c;
      c.key = key.substr(std::min(prefix.size(), key.size()));
      if (!Base64Decode(StrField(*kv, "value"), &c.value)) c.value.clear();
      c.kind = StrField(ev, "type") == "DELETE" ? KeyChange::Kind::kDeleted
               : IntField(*kv, "version") == 1  ? KeyChange::Kind::kCreated
                                                : KeyChange::Kind::kUpdated;
      changes->push_back(std::move(c));
    }
  }
  return true;
}

int64_t IntField(const nlohmann::json& o, const char* key) {
  if (!o.is_object()) return 0;
  auto it = o.find(key);
  if (it == o.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string())
    return std::atoll(it->get_ref<const std::string&>().c_str());
  return 0;
}

std::string StrField(const nlohmann::json& o, const char* key) {
  if (!o.is_object()) return "";
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : "";
}

bool BoolField(const nlohmann::json& o, const char* key) {
  if (!o.is_object()) return false;
  auto it = o.find(key);
  return it != o.end() && it->is_boolean() && it->get<bool>();
}

// A /v3/kv/range reply holds "kvs" at the top; a txn's range response
// holds it under "response_range". Both are read here, so one reader
// serves Add's count, Get's value and CompareSet's current value.
Kv FirstKv(const nlohmann::json& range) {
  Kv kv;
  if (!range.is_object()) return kv;
  auto inner = range.find("response_range");
  const nlohmann::json& r = inner != range.end() ? *inner : range;
  if (!r.is_object()) return kv;
  auto kvs = r.find("kvs");
  if (kvs == r.end() || !kvs->is_array() || kvs->empty() ||
      !(*kvs)[0].is_object())
    return kv;
  const nlohmann::json& first = (*kvs)[0];
  kv.found = true;
  if (!Base64Decode(StrField(first, "value"), &kv.value)) kv.value.clear();
  kv.mod_revision = IntField(first, "mod_revision");
  kv.version = IntField(first, "version");
  return kv;
}

Status DecodeRangeAll(const nlohmann::json& reply,
                      std::map<std::string, Kv>* out, int64_t* revision) {
  out->clear();
  if (!reply.is_object()) return Status::Io("etcd: malformed reply to a read");
  auto kvs = reply.find("kvs");
  if (kvs != reply.end()) {
    if (!kvs->is_array()) return Status::Io("etcd: malformed reply to a read");
    for (const auto& one : *kvs) {
      std::string key;
      if (!one.is_object() || !Base64Decode(StrField(one, "key"), &key))
        return Status::Io("etcd: malformed key in a read");
      Kv& kv = (*out)[key];
      kv.found = true;
      if (!Base64Decode(StrField(one, "value"), &kv.value)) kv.value.clear();
      kv.mod_revision = IntField(one, "mod_revision");
      kv.version = IntField(one, "version");
    }
  }
  if (revision) {
    auto header = reply.find("header");
    *revision = header != reply.end() ? IntField(*header, "revision") : 0;
  }
  return Status::Ok();
}

// The number of responses must match the requests: a shorter list would
// leave keys unread that the caller takes as missing, which a rendezvous
// reads as a node that never came.
Status DecodeRanges(const nlohmann::json& reply, size_t n, std::vector<Kv>* out,
                    int64_t* revision) {
  auto responses = reply.is_object() ? reply.find("responses") : reply.end();
  if (!reply.is_object() || responses == reply.end() ||
      !responses->is_array() || responses->size() != n)
    return Status::Io("etcd: malformed reply to a read");
  out->clear();
  for (const auto& op : *responses) out->push_back(FirstKv(op));
  if (revision) {
    auto header = reply.find("header");
    *revision = header != reply.end() ? IntField(*header, "revision") : 0;
  }
  return Status::Ok();
}

}  // namespace dtrun::rendezvous::etcd_framing

namespace dtrun::rendezvous {

std::string Base64Encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

bool Base64Decode(std::string_view text, std::string* bytes) {
  if (text.size() % 4 != 0) return false;
  bytes->assign(3 * text.size() / 4, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(bytes->data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) return false;
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t pad = 0;
  for (size_t i = text.size(); i > 0 && text[i - 1] == '=' && pad < 2; --i)
    ++pad;
  bytes->resize(static_cast<size_t>(n) - pad);
  return true;
}

}  // namespace dtrun::rendezvous
