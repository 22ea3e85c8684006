#include "rendezvous/etcd_framing.h"

#include <gtest/gtest.h>

namespace dtrun::rendezvous::etcd_framing {
namespace {

// Replies as etcd 3.4's gateway writes them (captured from a member).
const std::string kSized =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    "Grpc-Metadata-Content-Type: application/grpc\r\nContent-Length: 13\r\n"
    "\r\n{\"header\":{}}";
const std::string kErrorWithTrailer =
    "HTTP/1.1 412 Precondition Failed\r\nTrailer: Grpc-Trailer-Content-Type\r\n"
    "Transfer-Encoding: chunked\r\n\r\n"
    "13\r\n{\"error\":\"e\",\"c\":1}\r\n"
    "0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n\r\n";
const std::string kWatch =
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    "1c\r\n{\"result\":{\"created\":true}}\n\r\n";

// A whole unary reply from `bytes`, fed `step` bytes at a time.
Took Reply(const std::string& bytes, size_t step, Head* head,
           std::string* body) {
  std::string in;
  size_t fed = 0;
  auto more = [&] {
    if (fed >= bytes.size()) return false;
    in += bytes.substr(fed, step);
    fed += step;
    return true;
  };
  Took t;
  while ((t = TakeHead(&in, head)) == Took::kNeedMore)
    if (!more()) return t;
  if (t == Took::kBad) return t;
  if (!head->chunked) {
    while ((t = TakeSizedBody(&in, *head, body)) == Took::kNeedMore)
      if (!more()) return t;
    return t;
  }
  body->clear();
  for (;;) {
    std::string chunk;
    bool last = false;
    while ((t = TakeChunk(&in, &chunk, &last)) == Took::kNeedMore)
      if (!more()) return t;
    if (t == Took::kBad || last) return t;
    *body += chunk;
  }
}

TEST(EtcdFraming, RealRepliesParseWholeAndByteByByte) {
  for (size_t step : {size_t{1}, size_t{7}, size_t{4096}}) {
    Head head;
    std::string body;
    ASSERT_EQ(Reply(kSized, step, &head, &body), Took::kItem);
    EXPECT_EQ(head.status, 200);
    EXPECT_EQ(body, "{\"header\":{}}");
    ASSERT_EQ(Reply(kErrorWithTrailer, step, &head, &body), Took::kItem);
    EXPECT_EQ(head.status, 412);
    EXPECT_TRUE(head.chunked);
    EXPECT_EQ(body, "{\"error\":\"e\",\"c\":1}");
  }
}

TEST(EtcdFraming, TheLastChunksTrailerIsConsumedSoTheNextReplyParses) {
  std::string in = kErrorWithTrailer + kSized;
  Head head;
  ASSERT_EQ(TakeHead(&in, &head), Took::kItem);
  std::string chunk;
  bool last = false;
  ASSERT_EQ(TakeChunk(&in, &chunk, &last), Took::kItem);
  ASSERT_EQ(TakeChunk(&in, &chunk, &last), Took::kItem);
  EXPECT_TRUE(last);
  EXPECT_EQ(in, kSized);
}

TEST(EtcdFraming, HostileFramingIsBadNotMemory) {
  Head head;
  std::string in(kMaxHead + 1, 'x');  // a head that never ends
  EXPECT_EQ(TakeHead(&in, &head), Took::kBad);
  in = "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n";
  EXPECT_EQ(TakeHead(&in, &head), Took::kBad);  // overflow
  in = "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n";
  EXPECT_EQ(TakeHead(&in, &head), Took::kBad);
  in = "SSH-2.0-OpenSSH\r\n\r\n";
  EXPECT_EQ(TakeHead(&in, &head), Took::kBad);
  std::string chunk;
  bool last = false;
  in = "fffffffffffffffff\r\n";  // a chunk over 256 MiB
  EXPECT_EQ(TakeChunk(&in, &chunk, &last), Took::kBad);
  in = std::string(kMaxChunkLine + 1, '1');  // a size line that never ends
  EXPECT_EQ(TakeChunk(&in, &chunk, &last), Took::kBad);
  in = "3\r\nabcXY";  // no CRLF after the data
  EXPECT_EQ(TakeChunk(&in, &chunk, &last), Took::kBad);
  // Neither a length nor chunks: would end only with the connection.
  head = Head{};
  EXPECT_EQ(TakeSizedBody(&in, head, &chunk), Took::kBad);
  EXPECT_EQ(ParseSize(" 1a ", 16), 26);
  EXPECT_EQ(ParseSize("1 a", 16), -1);
}

TEST(EtcdFraming, WatchMessagesBecomeChangesAndMoveRevisionsOn) {
  // key "/p/a" = L3AvYQ==, value "v" = dg==
  std::string pending =
      "{\"result\":{\"events\":[{\"kv\":{\"key\":\"L3AvYQ==\",\"value\":"
      "\"dg==\",\"mod_revision\":\"7\",\"version\":\"1\"}},{\"type\":"
      "\"DELETE\",\"kv\":{\"key\":\"L3AvYQ==\",\"mod_revision\":\"9\"}}]}}\n"
      "not json\n{\"result\":{\"events\":[{\"kv\":{\"key\":5}}]}}\n{\"res";
  std::vector<WatchedKey> keys{{"/p/a", 3}};
  std::vector<KeyChange> changes;
  ASSERT_TRUE(DrainWatch(&pending, "/p/", &keys, &changes));
  ASSERT_EQ(changes.size(), 2u);  // a key of the wrong type: no change
  EXPECT_EQ(changes[0].key, "a");
  EXPECT_EQ(changes[0].value, "v");
  EXPECT_EQ(changes[0].kind, KeyChange::Kind::kCreated);
  EXPECT_EQ(changes[1].kind, KeyChange::Kind::kDeleted);
  EXPECT_EQ(keys[0].revision, 9);
  EXPECT_EQ(pending, "{\"res");  // the rest of a line waits
  pending = "{\"result\":{\"canceled\":true}}\n";
  EXPECT_FALSE(DrainWatch(&pending, "/p/", &keys, &changes));
  pending = "{\"result\":{\"canceled\":\"yes\",\"events\":{}}}\n";
  EXPECT_TRUE(DrainWatch(&pending, "/p/", &keys, &changes));
}

TEST(EtcdFraming, AWatchReplyIsChunksOfLines) {
  std::string in = kWatch;
  Head head;
  ASSERT_EQ(TakeHead(&in, &head), Took::kItem);
  std::string chunk;
  bool last = true;
  ASSERT_EQ(TakeChunk(&in, &chunk, &last), Took::kItem);
  EXPECT_FALSE(last);
  EXPECT_EQ(chunk, "{\"result\":{\"created\":true}}\n");
  EXPECT_EQ(TakeChunk(&in, &chunk, &last), Took::kNeedMore);
}

}  // namespace
}  // namespace dtrun::rendezvous::etcd_framing
