#pragma once

// Codec for PyTorch's c10d TCPStore protocol. Bytes in, Request/Reply out; no
// sockets. All integers are little-endian (host order on every platform
// PyTorch ships for).
//
// clang-format off
// Grammar (one request; there is no frame length, fields are read in turn):
//   request  := opcode:u8 body
//   str      := len:u64 byte{len}          keys and values alike
//   keys     := n:u64 str{n}
//   body(SET)         := str key, str value                 -> no reply
//   body(COMPARE_SET) := str key, str expected, str desired -> str
//   body(GET)         := str key                            -> str
//   body(ADD)         := str key, delta:i64                 -> i64
//   body(CHECK)       := keys                               -> u8 (0 ready, 1 not)
//   body(WAIT)        := keys                               -> u8 0, deferred until all exist
//   body(GETNUMKEYS)  := -                                  -> i64
//   body(WATCH_KEY)   := str key   (1.13 only)              -> u8 3; then per change:
//                        u8 type (0 updated, 1 created, 2 deleted) str key str old str new
//   body(DELETE_KEY)  := str key                            -> i64 (0 or 1)
//   body(APPEND)      := str key, str data                  -> no reply
//   body(MULTI_GET)   := keys                               -> str{n}
//   body(MULTI_SET)   := n:u64 (str key, str value){n}      -> no reply
//   body(CANCEL_WAIT) := -                                  -> u8 1
//   body(VALIDATE)    := magic:u32 (0x3C85F7CE)             -> no reply
//   body(PING)        := nonce:u32                          -> u32 nonce
//   body(QUEUE_PUSH)  := str key, str item                  -> no reply
//   body(QUEUE_POP)   := str key                            -> i64 len_before [str item if > 0]
//   body(QUEUE_LEN)   := str key                            -> i64
//   body(LIST_KEYS)   := -                                  -> i64 n, str{n}
//   body(BARRIER)     := str key, world:i64                 -> u8 0 once counter(key) >= world
// clang-format on
//
// Opcode values differ by dialect: kTorch113 is PyTorch 1.13 (and 2.0);
// kTorch2 is PyTorch >= 2.2, whose connections start with VALIDATE. A
// connection's dialect is chosen from its first five bytes (DetectDialect).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrun::rendezvous {

enum class Dialect : uint8_t { kUnknown, kTorch113, kTorch2 };

// Wire values of PyTorch 1.13.1's QueryType (TCPStore.cpp).
enum class Query113 : uint8_t {
  kSet = 0,
  kCompareSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kGetNumKeys = 6,
  kWatchKey = 7,
  kDeleteKey = 8,
};

// Wire values of PyTorch >= 2.2's QueryType (TCPStoreBackend.hpp, up to the
// BARRIER of recent main).
enum class Query2 : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
  kQueuePush = 14,
  kQueuePop = 15,
  kQueueLen = 16,
  kListKeys = 17,
  kBarrier = 18,
};

// Dialect-independent operation.
enum class Op : uint8_t {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kBarrier,
};

const char* OpName(Op op);

constexpr uint32_t kValidateMagic = 0x3C85F7CE;
constexpr uint8_t kCheckReady = 0, kCheckNotReady = 1;
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;
constexpr uint8_t kWatchUpdated = 0, kWatchCreated = 1, kWatchDeleted = 2,
                  kWatchRegistered = 3;

struct Request {
  Op op = Op::kGetNumKeys;
  std::vector<std::string> keys;    // every key, in wire order
  std::vector<std::string> values;  // SET/APPEND/PUSH value; CAS expected,
                                    // desired; MULTI_SET values
  int64_t number = 0;               // ADD delta, BARRIER world size
  uint32_t word = 0;                // VALIDATE magic, PING nonce
};

// A request of `op` with its keys, values and number, for the clients.
inline Request MakeRequest(Op op, std::vector<std::string> keys,
                           std::vector<std::string> values = {},
                           int64_t number = 0) {
  Request req;
  req.op = op;
  req.keys = std::move(keys);
  req.values = std::move(values);
  req.number = number;
  return req;
}

// Caps applied before anything is allocated from a length on the wire.
struct WireLimits {
  uint64_t max_value_bytes = 64ull << 20;  // per value; default 64 MiB
  uint64_t max_key_bytes = 1ull << 20;     // per key; default 1 MiB
  uint64_t max_keys = 128 * 1024;          // per CHECK/WAIT/MULTI_*
};

enum class DecodeState { kNeedMore, kDone, kMalformed };

// Picks the dialect from a connection's first bytes: kUnknown while fewer
// than five bytes could still be a VALIDATE.
Dialect DetectDialect(std::string_view first_bytes);

// Decodes one request from the front of `in`. Never blocks, never throws.
// kDone: *out filled, *consumed = bytes used. kNeedMore: *consumed = total
// bytes known to be needed so far (a hint; decode again once that many
// arrived). kMalformed: *error says why (unknown opcode, length over a cap).
DecodeState DecodeRequest(std::string_view in, Dialect dialect,
                          const WireLimits& limits, Request* out,
                          size_t* consumed, std::string* error);

// Appends the request in `dialect`. REQUIRES: the op exists in it.
void EncodeRequest(const Request& req, Dialect dialect, std::string* out);

// One frame of a 1.13 watch connection: a WATCH_KEY's acknowledgement
// (kWatchRegistered), or a change of a watched key (kWatchUpdated,
// kWatchCreated, kWatchDeleted) followed by the key, the old value and the
// new one, each length-prefixed (the old value is not kept).
struct WatchFrame {
  uint8_t type = kWatchRegistered;
  std::string key, value;
};
// Decodes the frame at the front of `in`: kDone (*consumed bytes used),
// kNeedMore (the frame is still on its way; empty `in` too), kMalformed (a
// first byte that is neither; *error names it).
DecodeState DecodeWatchFrame(std::string_view in, WatchFrame* out,
                             size_t* consumed, std::string* error);

// Reply field encoders (identical in both dialects).
void PutU8(std::string* out, uint8_t v);
void PutU32(std::string* out, uint32_t v);
void PutI64(std::string* out, int64_t v);
void PutU64(std::string* out, uint64_t v);
void PutBytes(std::string* out, std::string_view bytes);

// Reply field decoders for clients: read at *pos, advance it; false when
// `in` is too short.
bool GetU8(std::string_view in, size_t* pos, uint8_t* v);
bool GetU32(std::string_view in, size_t* pos, uint32_t* v);
bool GetI64(std::string_view in, size_t* pos, int64_t* v);
bool GetU64(std::string_view in, size_t* pos, uint64_t* v);

}  // namespace dtrun::rendezvous
