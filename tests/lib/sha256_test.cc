#include "lib/formats/sha256.h"

#include <gtest/gtest.h>

namespace dtrun::train {
namespace {

TEST(Sha256Test, MatchesFipsVectors) {
  EXPECT_EQ(Sha256Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(
      Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, IncrementalEqualsOneShot) {
  std::string data(1000, 'x');
  Sha256 h;
  for (size_t i = 0; i < data.size(); i += 7) h.Update(data.substr(i, 7));
  EXPECT_EQ(h.HexDigest(), Sha256Hex(data));
}

}  // namespace
}  // namespace dtrun::train
