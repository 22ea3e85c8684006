// Replays the >= 2.2 byte fixtures against our server over a real socket.
// The fixtures' torch 2.6 part (every request but opcodes 14-18, which are
// later torch's) is what torch 2.6's own client sends and its own server
// answers: tests/compat/fixture_capture_test.py (ctest label compat2)
// checks them against a live capture.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "rendezvous/store_server.h"
#include "tests/testing/loopback_server.h"
#include "tests/testing/raw_conn.h"

namespace dtrun::rendezvous {
namespace {

std::string FromHex(const std::string& text) {
  std::string out, digits;
  for (char c : text) {
    if (std::isxdigit(static_cast<unsigned char>(c))) digits.push_back(c);
  }
  for (size_t i = 0; i + 1 < digits.size(); i += 2) {
    out.push_back(
        static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16)));
  }
  return out;
}

class Torch2FixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(Torch2FixtureTest, ServerRepliesAsReferenceSays) {
  auto server = StoreServer::Start(testing::LoopbackServerOptions());
  ASSERT_TRUE(server.ok());
  (*server)->RunInBackground();
  std::ifstream in(std::string(DTRUN_SOURCE_DIR) +
                   "/tests/rendezvous/fixtures/" + GetParam() + ".hex");
  ASSERT_TRUE(in) << GetParam();
  testing::RawConn conn((*server)->port());
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::string bytes = FromHex(line.substr(1));
    if (line[0] == '>') {
      ASSERT_TRUE(conn.Send(bytes)) << GetParam() << ":" << line_no;
    } else {
      EXPECT_EQ(conn.Read(bytes.size()), bytes) << GetParam() << ":" << line_no;
    }
  }
  // Nothing further may arrive (e.g. a stray STOP_WAITING after a cancel).
  EXPECT_EQ(conn.Read(1, std::chrono::milliseconds(50)), "") << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Torch2FixtureTest,
                         ::testing::Values("torch2_handshake",
                                           "torch2_wait_cancel",
                                           "torch2_multi_append",
                                           "torch2_queue", "torch2_compare_set",
                                           "torch2_barrier"));

}  // namespace
}  // namespace dtrun::rendezvous
