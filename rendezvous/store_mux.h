#pragma once

// Multiplexed store connections: a node's store proxy (store_proxy.h)
// carries every worker connection of its node to the workers' store over
// one TCP connection, each as a numbered stream whose bytes are exactly
// what the worker sent and what the store answered (TCPStore's wire, either
// dialect, unchanged). The store runs each stream as if it were a
// connection of its own; the store's host sees nodes, not workers.
//
// clang-format off
//   connection := hello frame*
//   hello      := D7 'd' 't' 'm' 'u' 'x' 01 0A     8 bytes; the store answers with the same 8
//   frame      := type:u8 stream:u32 len:u32 payload{len}   (little-endian)
//   type 1 OPEN   proxy -> store, len 0: a worker connected
//   type 2 DATA   either way: the stream's next bytes
//   type 3 CLOSE  either way, len 0: that side closed the stream
// clang-format on
//
// The first byte 0xD7 is no opcode of either dialect, so a store that does
// not know the hello closes the connection (a malformed request), and the
// proxy says the store is too old rather than hanging.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rendezvous/wire.h"

namespace dtrun::rendezvous {

inline constexpr std::string_view kMuxHello(
    "\xD7"
    "dtmux\x01\n",
    8);
inline constexpr size_t kMuxHeaderSize = 9;

enum class MuxType : uint8_t { kOpen = 1, kData = 2, kClose = 3 };

struct MuxFrame {
  MuxType type = MuxType::kData;
  uint32_t stream = 0;
  uint32_t length = 0;  // payload bytes following the header
};

// Whether a connection's first bytes may be (or are) the hello: the first
// byte says it; kMuxHello's size decides.
inline bool LooksLikeMuxHello(std::string_view first_bytes) {
  return !first_bytes.empty() && first_bytes[0] == kMuxHello[0];
}

// Appends a frame's header.
void PutMuxHeader(std::string* out, MuxType type, uint32_t stream,
                  uint32_t length);

// Decodes the header at the front of `in`: kNeedMore while fewer than
// kMuxHeaderSize bytes; kMalformed (with *error) for an unknown type, a
// length over `max_payload`, or OPEN/CLOSE with a payload.
DecodeState DecodeMuxHeader(std::string_view in, uint32_t max_payload,
                            MuxFrame* out, std::string* error);

}  // namespace dtrun::rendezvous
