// The multiplexed connection's frame header: nine bytes, checked before a
// payload length is believed (the store caps it at what a proxy sends).

#include "rendezvous/store_mux.h"

namespace dtrun::rendezvous {

void PutMuxHeader(std::string* out, MuxType type, uint32_t stream,
                  uint32_t length) {
  PutU8(out, static_cast<uint8_t>(type));
  PutU32(out, stream);
  PutU32(out, length);
}

DecodeState DecodeMuxHeader(std::string_view in, uint32_t max_payload,
                            MuxFrame* out, std::string* error) {
  if (in.size() < kMuxHeaderSize) return DecodeState::kNeedMore;
  size_t pos = 0;
  uint8_t type = 0;
  GetU8(in, &pos, &type);
  GetU32(in, &pos, &out->stream);
  GetU32(in, &pos, &out->length);
  if (type < 1 || type > 3) {
    *error = "unknown frame type " + std::to_string(type);
    return DecodeState::kMalformed;
  }
  out->type = static_cast<MuxType>(type);
  if (out->type != MuxType::kData && out->length != 0) {
    *error = "an OPEN or CLOSE frame with " + std::to_string(out->length) +
             " bytes of payload";
    return DecodeState::kMalformed;
  }
  if (out->length > max_payload) {
    *error = "a frame of " + std::to_string(out->length) +
             " bytes, over the cap of " + std::to_string(max_payload);
    return DecodeState::kMalformed;
  }
  return DecodeState::kDone;
}

}  // namespace dtrun::rendezvous
