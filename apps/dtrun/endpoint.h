#pragma once

// Rendezvous endpoints: "host[:port]" text and whether a host is this one.

#include <cstdint>
#include <optional>
#include <string>

namespace dtrun::agent {

// A "host[:port]" endpoint, parsed once from the command line.
struct Endpoint {
  std::string text;  // as given, for messages; "" when none
  std::string host;
  std::optional<uint16_t> port;  // none: the backend's default applies
  bool empty() const { return text.empty(); }
  uint16_t PortOr(uint16_t fallback) const { return port.value_or(fallback); }
};

// "host[:port]" or "[v6]:port" -> Endpoint; "" -> an empty one. nullopt on
// bad syntax or a port outside 0-65535. Pure.
std::optional<Endpoint> ParseEndpoint(const std::string& text);

// "host[:port]" or "[v6]:port" -> host, port (`default_port` when none).
// False on bad syntax or a port outside 0-65535. Pure.
bool SplitEndpoint(const std::string& text, uint16_t default_port,
                   std::string* host, uint16_t* port);

// Whether `host` names this machine: loopback, one of its interface
// addresses, or its host name (torchrun's is_host inference). Resolves names:
// may block for as long as the resolver takes, so keep it out of the poll loop.
// An unresolvable name is not this host.
bool IsThisHost(const std::string& host);

}  // namespace dtrun::agent
