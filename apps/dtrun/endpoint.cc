// Parsing of --rdzv-endpoint / --master-addr text and the "is this endpoint
// mine" test that decides whether this node hosts the c10d store. Parsing is
// pure; IsThisHost asks the resolver and the kernel's interface list.
#include "apps/dtrun/endpoint.h"

#include <ifaddrs.h>
#include <netdb.h>

#include <cstdlib>

#include "rendezvous/util/os_util.h"

namespace dtrun::agent {

std::optional<Endpoint> ParseEndpoint(const std::string& text) {
  Endpoint e;
  e.text = text;
  if (text.empty()) return e;
  // Brackets are the only way to give an IPv6 address with a port, since the
  // address itself holds colons; "[::1]" alone has no port.
  std::string rest = text;
  if (rest[0] == '[') {
    auto close = rest.find(']');
    if (close == std::string::npos) return std::nullopt;
    e.host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (rest.empty()) return e.host.empty() ? std::nullopt : std::optional(e);
    if (rest[0] != ':') return std::nullopt;
    rest = rest.substr(1);
  } else {
    // The last colon separates the port. A bare IPv6 literal without brackets
    // is therefore misread; torchrun's parser has the same limitation.
    auto colon = rest.rfind(':');
    if (colon == std::string::npos) {
      e.host = rest;
      return e;
    }
    e.host = rest.substr(0, colon);
    rest = rest.substr(colon + 1);
  }
  // strtol plus the end check rejects "29500x" and an empty port ("host:"),
  // which atoi would silently read as a number.
  char* end = nullptr;
  long p = std::strtol(rest.c_str(), &end, 10);
  if (rest.empty() || *end || p < 0 || p > 65535 || e.host.empty())
    return std::nullopt;
  e.port = static_cast<uint16_t>(p);
  return e;
}

bool SplitEndpoint(const std::string& text, uint16_t default_port,
                   std::string* host, uint16_t* port) {
  auto e = ParseEndpoint(text);
  if (!e || e->empty()) return false;
  *host = e->host;
  *port = e->PortOr(default_port);
  return true;
}

bool IsThisHost(const std::string& host) {
  // torchrun infers is_host the same way: the endpoint names this machine if it
  // is localhost, its own host name, or resolves to one of its addresses. The
  // name checks come first so a host without working DNS still recognises
  // itself.
  if (host == "localhost" || host == os::HostName()) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  ifaddrs* ifs = nullptr;
  getifaddrs(&ifs);
  // Any loopback result counts (a name may resolve to 127.0.1.1 on Debian);
  // otherwise compare the numeric forms against every interface address, since
  // a node reached by its LAN address must still host the store.
  bool local = false;
  for (addrinfo* ai = res; ai && !local; ai = ai->ai_next) {
    char a[NI_MAXHOST];
    getnameinfo(ai->ai_addr, ai->ai_addrlen, a, sizeof(a), nullptr, 0,
                NI_NUMERICHOST);
    std::string addr = a;
    if (addr == "::1" || addr.rfind("127.", 0) == 0) local = true;
    for (ifaddrs* i = ifs; i && !local; i = i->ifa_next) {
      if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET &&
                           i->ifa_addr->sa_family != AF_INET6))
        continue;
      char b[NI_MAXHOST];
      socklen_t len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in)
                                                        : sizeof(sockaddr_in6);
      if (getnameinfo(i->ifa_addr, len, b, sizeof(b), nullptr, 0,
                      NI_NUMERICHOST) == 0 &&
          addr == b) {
        local = true;
      }
    }
  }
  if (ifs) freeifaddrs(ifs);
  freeaddrinfo(res);
  return local;
}

}  // namespace dtrun::agent
