#include "apps/dtrun/in_place.h"

#include <gtest/gtest.h>

#include "rendezvous/in_place.h"
#include "rendezvous/memory_store.h"

namespace dtrun::agent {
namespace {

// On many nodes one replacement runs at a time: the first node to claim
// the next attempt gets it, another node's claim meanwhile is refused (its
// group restarts whole), and once the replacement is back in step the
// next claim gets the attempt after it, whichever node's restart count
// it starts from.
// A kept worker reads its round file at its step's next collective: a slow
// model's step adds to the wait, a fast or unknown one does not.
TEST(InPlaceKeptTest, TheWaitForAKeptWorkerGrowsWithItsStep) {
  using std::chrono::milliseconds;
  EXPECT_EQ(in_place::KeptStuckLimit(-1), milliseconds(in_place::kKeptStuck));
  EXPECT_EQ(in_place::KeptStuckLimit(0), milliseconds(in_place::kKeptStuck));
  EXPECT_EQ(in_place::KeptStuckLimit(0.05),
            milliseconds(in_place::kKeptStuck) + milliseconds(100));
  EXPECT_EQ(in_place::KeptStuckLimit(1.9),
            milliseconds(in_place::kKeptStuck) + milliseconds(3800));
  EXPECT_EQ(in_place::KeptStuckLimit(1e9),
            milliseconds(in_place::kKeptStuck) + milliseconds(7200000));
}

TEST(InPlaceClaimTest, OneReplacementAtATimeAcrossTheNodes) {
  rendezvous::MemoryStore store;
  EXPECT_EQ(in_place::Claim(&store, 0, "node 1"), 1);
  EXPECT_EQ(in_place::Claim(&store, 0, "node 0"), -1);
  in_place::Release(&store, 1);
  EXPECT_EQ(in_place::Claim(&store, 0, "node 0"), 2);  // node 0 saw no 1
  EXPECT_EQ(store.Get(rendezvous::in_place::kClaimKey).value(),
            "busy 2 node 0");
  EXPECT_EQ(in_place::Claim(nullptr, 0, "node 0"), -1);
}

TEST(InPlaceClaimTest, TheSurvivorsAreToldTheReplacedRank) {
  rendezvous::MemoryStore store;
  EXPECT_TRUE(in_place::Announce(&store, 2, 7));
  EXPECT_EQ(store.Get(rendezvous::in_place::RegroupKey(2)).value(), "7");
  EXPECT_FALSE(in_place::Announce(nullptr, 2, 7));
}

}  // namespace
}  // namespace dtrun::agent
