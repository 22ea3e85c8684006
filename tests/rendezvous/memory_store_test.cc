#include "rendezvous/memory_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "rendezvous/prefix_store.h"

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;

TEST(MemoryStoreTest, WaitReturnsWhenAnotherThreadSets) {
  MemoryStore store;
  std::thread setter([&] { store.Set("k", "v"); });
  EXPECT_TRUE(store.Wait({"k"}, milliseconds(2000)).ok());
  setter.join();
  EXPECT_EQ(*store.Get("k"), "v");
}

TEST(MemoryStoreTest, WaitTimesOutNamingTheKeys) {
  MemoryStore store;
  Status s = store.Wait({"a", "b"}, milliseconds(1));
  EXPECT_EQ(s.code(), Status::Code::kTimeout);
  EXPECT_NE(s.message().find("[a, b]"), std::string::npos);
}

TEST(MemoryStoreTest, CompareSetAndAddMatchC10d) {
  MemoryStore store;
  EXPECT_EQ(*store.CompareSet("k", "x", "y"), "x");
  EXPECT_FALSE(*store.Check({"k"}));
  EXPECT_EQ(*store.CompareSet("k", "", "y"), "y");
  EXPECT_EQ(*store.Add("n", 4), 4);
  EXPECT_EQ(*store.Add("n", -1), 3);
  EXPECT_FALSE(store.Add("k", 1).ok());
  EXPECT_EQ(*store.NumKeys(), 2);
  EXPECT_TRUE(*store.DeleteKey("k"));
  EXPECT_FALSE(*store.DeleteKey("k"));
}

TEST(PrefixStoreTest, NamespacesKeysWithSlash) {
  MemoryStore inner;
  PrefixStore store("attempt_1", &inner);
  store.Set("k", "v");
  EXPECT_TRUE(*inner.Check({"attempt_1/k"}));
  EXPECT_EQ(*store.Add("n", 2), 2);
  EXPECT_TRUE(store.Wait({"k", "n"}, milliseconds(10)).ok());
  EXPECT_TRUE(*store.DeleteKey("k"));
  EXPECT_EQ(*store.NumKeys(), 1);
}

}  // namespace
}  // namespace dtrun::rendezvous
