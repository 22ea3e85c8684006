#pragma once

// Host name lookups in the static dtrun and dtstore. A static glibc runs the
// `files` and `dns` services of /etc/nsswitch.conf by itself, but loads any
// other (`resolve`, `myhostname`, `mdns4_minimal`, `sss`, LDAP) as a shared
// object built for the system's own glibc, which a binary built elsewhere
// cannot host safely. So a static binary keeps only files and dns, the same
// on every system, and a name that only a dropped service knew fails with a
// message that says what to do.

#include <string>
#include <vector>

namespace dtrun::os {

// The services a static binary runs for an nsswitch.conf `hosts:` line,
// with the [action] items that follow each kept one, and the ones dropped.
struct HostsLookup {
  std::string kept;                  // "files [NOTFOUND=return] dns"
  std::vector<std::string> dropped;  // {"mdns4_minimal", "myhostname"}
};

// The `hosts:` line of an nsswitch.conf's text, reduced to files and dns
// ("files dns" when it names neither, or has no hosts line). Pure.
HostsLookup BuiltinHostsLookup(const std::string& nsswitch_conf);

// In a static binary (one with no program interpreter): reads
// /etc/nsswitch.conf and, when its hosts line names other services, makes
// glibc run only the kept ones (__nss_configure_lookup). A no-op in a
// dynamically linked process, where glibc loads its own modules. Call once,
// at the start of main, before any thread.
void UseBuiltinNameLookup();

// What to append to a failed lookup's message: "" when nothing was
// dropped, else "; dtrun resolves names from /etc/hosts and DNS only
// (nsswitch.conf's hosts line also names X, Y, which a static binary does
// not load): put the name in /etc/hosts, give an IP address, or ...".
std::string NameLookupHint();

}  // namespace dtrun::os
