#include "rendezvous/util/name_lookup.h"

#include <gtest/gtest.h>

namespace dtrun::os {
namespace {

using Names = std::vector<std::string>;

TEST(BuiltinHostsLookupTest, KeepsFilesAndDnsAsTheyAre) {
  HostsLookup l = BuiltinHostsLookup("passwd: files\nhosts:   files dns\n");
  EXPECT_EQ(l.kept, "files dns");
  EXPECT_EQ(l.dropped, Names{});
}

TEST(BuiltinHostsLookupTest, DropsLoadedModulesWithTheirActions) {
  // Ubuntu's default: mdns4_minimal's [NOTFOUND=return] goes with it, or a
  // name unknown to /etc/hosts would never reach DNS.
  HostsLookup ubuntu = BuiltinHostsLookup(
      "hosts: files mdns4_minimal [NOTFOUND=return] dns myhostname\n");
  EXPECT_EQ(ubuntu.kept, "files dns");
  EXPECT_EQ(ubuntu.dropped, (Names{"mdns4_minimal", "myhostname"}));
  // Fedora's and RHEL 9's, an action spanning two words.
  HostsLookup rhel = BuiltinHostsLookup(
      "hosts: files myhostname resolve [!UNAVAIL=return !NOTFOUND=continue] "
      "dns\n");
  EXPECT_EQ(rhel.kept, "files dns");
  EXPECT_EQ(rhel.dropped, (Names{"myhostname", "resolve"}));
}

TEST(BuiltinHostsLookupTest, KeepsTheActionsOfKeptServices) {
  HostsLookup l =
      BuiltinHostsLookup("hosts: files [NOTFOUND=return] sss dns # a comment");
  EXPECT_EQ(l.kept, "files [NOTFOUND=return] dns");
  EXPECT_EQ(l.dropped, Names{"sss"});
}

TEST(BuiltinHostsLookupTest, NothingBuiltinLeftMeansFilesAndDns) {
  EXPECT_EQ(BuiltinHostsLookup("hosts: resolve\n").kept, "files dns");
  EXPECT_EQ(BuiltinHostsLookup("").kept, "files dns");
  EXPECT_EQ(BuiltinHostsLookup("# hosts: ldap\n").dropped, Names{});
}

TEST(BuiltinHostsLookupTest, ReadsTheFirstHostsLineOnly) {
  HostsLookup l =
      BuiltinHostsLookup("  hosts: dns files\nhosts: files mdns dns\n");
  EXPECT_EQ(l.kept, "dns files");
  EXPECT_EQ(l.dropped, Names{});
}

}  // namespace
}  // namespace dtrun::os
