// Decoding works on whatever bytes have arrived: a request has no length
// prefix, so the decoder walks its fields and, when it runs out, reports how
// many bytes it needs in all. The server then waits for that many before
// decoding again, instead of re-parsing a large value on every read.
// Lengths are checked against WireLimits before anything is allocated, so a
// hostile length cannot make the server reserve gigabytes.

#include "rendezvous/wire.h"

#include <cstring>

#include "rendezvous/util/check.h"

namespace dtrun::rendezvous {
namespace {

// Reads fields from `in` in order. The first field that runs past the end
// sets need_more (with the total size known to be needed); the first length
// over a cap sets malformed. Later reads are then no-ops.
class Reader {
 public:
  Reader(std::string_view in, const WireLimits& limits)
      : in_(in), limits_(limits) {}

  bool ok() const { return !need_more_ && error_.empty(); }
  bool need_more() const { return need_more_; }
  size_t pos() const { return pos_; }
  size_t needed() const { return needed_; }
  const std::string& error() const { return error_; }

  template <typename T>
  T Fixed() {
    T v{};
    if (!Want(sizeof(T))) return v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  void Str(uint64_t cap, const char* what, std::string* out) {
    uint64_t len = Fixed<uint64_t>();
    if (!ok()) return;
    if (len > cap) {
      error_ = std::string(what) + " length " + std::to_string(len) +
               " exceeds the cap of " + std::to_string(cap) + " bytes";
      return;
    }
    if (!Want(len)) return;
    out->assign(in_.data() + pos_, len);
    pos_ += len;
  }

  void Key(std::vector<std::string>* keys) {
    keys->emplace_back();
    Str(limits_.max_key_bytes, "key", &keys->back());
  }
  void Value(std::vector<std::string>* values) {
    values->emplace_back();
    Str(limits_.max_value_bytes, "value", &values->back());
  }
  uint64_t Count() {
    uint64_t n = Fixed<uint64_t>();
    if (ok() && n > limits_.max_keys) {
      error_ = "key count " + std::to_string(n) + " exceeds the cap of " +
               std::to_string(limits_.max_keys);
    }
    return n;
  }

 private:
  bool Want(uint64_t n) {
    if (!ok()) return false;
    if (in_.size() - pos_ >= n) return true;
    need_more_ = true;
    needed_ = pos_ + n;
    return false;
  }

  std::string_view in_;
  const WireLimits& limits_;
  size_t pos_ = 0;
  size_t needed_ = 0;
  bool need_more_ = false;
  std::string error_;
};

// Opcode tables, indexed by the wire value. 1.13's numbering starts at SET;
// torch 2.2 inserted VALIDATE at 0 and renumbered everything after it,
// which is why one byte means different things per dialect.
bool OpFrom113(uint8_t v, Op* op) {
  static constexpr Op kMap[] = {
      Op::kSet,  Op::kCompareSet, Op::kGet,      Op::kAdd,      Op::kCheck,
      Op::kWait, Op::kGetNumKeys, Op::kWatchKey, Op::kDeleteKey};
  if (v >= sizeof(kMap) / sizeof(kMap[0])) return false;
  *op = kMap[v];
  return true;
}

bool OpFrom2(uint8_t v, Op* op) {
  static constexpr Op kMap[] = {
      Op::kValidate,   Op::kSet,      Op::kCompareSet, Op::kGet,
      Op::kAdd,        Op::kCheck,    Op::kWait,       Op::kGetNumKeys,
      Op::kDeleteKey,  Op::kAppend,   Op::kMultiGet,   Op::kMultiSet,
      Op::kCancelWait, Op::kPing,     Op::kQueuePush,  Op::kQueuePop,
      Op::kQueueLen,   Op::kListKeys, Op::kBarrier};
  if (v >= sizeof(kMap) / sizeof(kMap[0])) return false;
  *op = kMap[v];
  return true;
}

// The reverse lookup scans the tables: they are tiny, and one table per
// dialect cannot then disagree with its inverse.
bool OpTo(Op op, Dialect dialect, uint8_t* v) {
  for (int i = 0; i < 32; ++i) {
    Op candidate;
    bool known = dialect == Dialect::kTorch113
                     ? OpFrom113(static_cast<uint8_t>(i), &candidate)
                     : OpFrom2(static_cast<uint8_t>(i), &candidate);
    if (known && candidate == op) {
      *v = static_cast<uint8_t>(i);
      return true;
    }
  }
  return false;
}

void DecodeBody(Reader* r, Request* req) {
  switch (req->op) {
    case Op::kValidate:
    case Op::kPing:
      req->word = r->Fixed<uint32_t>();
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      r->Key(&req->keys);
      r->Value(&req->values);
      break;
    case Op::kCompareSet:
      r->Key(&req->keys);
      r->Value(&req->values);
      r->Value(&req->values);
      break;
    case Op::kGet:
    case Op::kWatchKey:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      r->Key(&req->keys);
      break;
    case Op::kAdd:
    case Op::kBarrier:
      r->Key(&req->keys);
      req->number = r->Fixed<int64_t>();
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet: {
      uint64_t n = r->Count();
      for (uint64_t i = 0; i < n && r->ok(); ++i) r->Key(&req->keys);
      break;
    }
    case Op::kMultiSet: {
      uint64_t n = r->Count();
      for (uint64_t i = 0; i < n && r->ok(); ++i) {
        r->Key(&req->keys);
        r->Value(&req->values);
      }
      break;
    }
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      break;
  }
}

void PutRaw(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}

template <typename T>
bool GetFixed(std::string_view in, size_t* pos, T* v) {
  if (in.size() < *pos || in.size() - *pos < sizeof(T)) return false;
  std::memcpy(v, in.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return true;
}

}  // namespace

const char* OpName(Op op) {
  static const char* kNames[] = {
      "VALIDATE",   "SET",       "COMPARE_SET", "GET",         "ADD",
      "CHECK",      "WAIT",      "GETNUMKEYS",  "WATCH_KEY",   "DELETE_KEY",
      "APPEND",     "MULTI_GET", "MULTI_SET",   "CANCEL_WAIT", "PING",
      "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN",   "LIST_KEYS",   "BARRIER"};
  size_t i = static_cast<size_t>(op);
  DTRUN_CHECK(i < sizeof(kNames) / sizeof(kNames[0]))
      << "Op " << i << " has no name";
  return kNames[i];
}

// A torch>=2.2 client always opens with VALIDATE: opcode 0 and the magic
// 0x3C85F7CE, little-endian. The same first byte is a SET in 1.13, so the
// five bytes together decide; a prefix of them is not enough yet (kUnknown),
// and any difference means 1.13. A 1.13 SET whose key length happens to
// begin CE F7 85 3C would need a key of at least 968 MiB, far over the cap.
Dialect DetectDialect(std::string_view b) {
  static constexpr unsigned char kValidate[5] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};
  size_t n = b.size() < 5 ? b.size() : 5;
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<unsigned char>(b[i]) != kValidate[i]) {
      return Dialect::kTorch113;
    }
  }
  return n == 5 ? Dialect::kTorch2 : Dialect::kUnknown;
}

DecodeState DecodeRequest(std::string_view in, Dialect dialect,
                          const WireLimits& limits, Request* out,
                          size_t* consumed, std::string* error) {
  if (in.empty()) {
    *consumed = 1;
    return DecodeState::kNeedMore;
  }
  uint8_t code = static_cast<uint8_t>(in[0]);
  Request req;
  bool known = dialect == Dialect::kTorch2 ? OpFrom2(code, &req.op)
                                           : OpFrom113(code, &req.op);
  if (!known) {
    *error = "unknown opcode " + std::to_string(code) + " for the " +
             (dialect == Dialect::kTorch2 ? "torch>=2.2" : "torch-1.13") +
             " dialect";
    return DecodeState::kMalformed;
  }
  Reader r(in.substr(1), limits);
  DecodeBody(&r, &req);
  if (!r.error().empty()) {
    *error = std::string(OpName(req.op)) + ": " + r.error();
    return DecodeState::kMalformed;
  }
  if (r.need_more()) {
    *consumed = 1 + r.needed();
    return DecodeState::kNeedMore;
  }
  *consumed = 1 + r.pos();
  *out = std::move(req);
  return DecodeState::kDone;
}

void EncodeRequest(const Request& req, Dialect dialect, std::string* out) {
  uint8_t code = 0;
  // An op the dialect lacks would go out as opcode 0 (SET or VALIDATE) and
  // desynchronize the stream; callers check the dialect first.
  DTRUN_CHECK(OpTo(req.op, dialect, &code))
      << OpName(req.op) << " has no opcode in the "
      << (dialect == Dialect::kTorch2 ? "torch>=2.2" : "torch-1.13")
      << " dialect";
  PutU8(out, code);
  switch (req.op) {
    case Op::kValidate:
    case Op::kPing:
      PutU32(out, req.word);
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      PutBytes(out, req.keys[0]);
      PutBytes(out, req.values[0]);
      break;
    case Op::kCompareSet:
      PutBytes(out, req.keys[0]);
      PutBytes(out, req.values[0]);
      PutBytes(out, req.values[1]);
      break;
    case Op::kGet:
    case Op::kWatchKey:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      PutBytes(out, req.keys[0]);
      break;
    case Op::kAdd:
    case Op::kBarrier:
      PutBytes(out, req.keys[0]);
      PutI64(out, req.number);
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      PutU64(out, req.keys.size());
      for (const auto& k : req.keys) PutBytes(out, k);
      break;
    case Op::kMultiSet:
      PutU64(out, req.keys.size());
      for (size_t i = 0; i < req.keys.size(); ++i) {
        PutBytes(out, req.keys[i]);
        PutBytes(out, req.values[i]);
      }
      break;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      break;
  }
}

void PutU8(std::string* out, uint8_t v) {
  out->push_back(static_cast<char>(v));
}
void PutU32(std::string* out, uint32_t v) { PutRaw(out, &v, sizeof(v)); }
void PutI64(std::string* out, int64_t v) { PutRaw(out, &v, sizeof(v)); }
void PutU64(std::string* out, uint64_t v) { PutRaw(out, &v, sizeof(v)); }
void PutBytes(std::string* out, std::string_view bytes) {
  PutU64(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

bool GetU8(std::string_view in, size_t* pos, uint8_t* v) {
  return GetFixed(in, pos, v);
}
bool GetU32(std::string_view in, size_t* pos, uint32_t* v) {
  return GetFixed(in, pos, v);
}
bool GetI64(std::string_view in, size_t* pos, int64_t* v) {
  return GetFixed(in, pos, v);
}
bool GetU64(std::string_view in, size_t* pos, uint64_t* v) {
  return GetFixed(in, pos, v);
}

// A change may arrive before the acknowledgement of a later WATCH_KEY, so
// the client decodes whatever bytes came, frame by frame.
DecodeState DecodeWatchFrame(std::string_view in, WatchFrame* out,
                             size_t* consumed, std::string* error) {
  if (in.empty()) return DecodeState::kNeedMore;
  const auto type = static_cast<uint8_t>(in[0]);
  out->type = type;
  if (type == kWatchRegistered) {
    *consumed = 1;
    return DecodeState::kDone;
  }
  if (type > kWatchDeleted) {
    *error = "byte " + std::to_string(type) +
             " is neither a watch acknowledgement nor a key change";
    return DecodeState::kMalformed;
  }
  size_t p = 1;
  std::string_view fields[3];
  for (std::string_view& field : fields) {
    uint64_t len = 0;
    if (!GetU64(in, &p, &len) || in.size() - p < len)
      return DecodeState::kNeedMore;
    field = in.substr(p, len);
    p += len;
  }
  out->key.assign(fields[0]);
  out->value.assign(fields[2]);
  *consumed = p;
  return DecodeState::kDone;
}

}  // namespace dtrun::rendezvous
