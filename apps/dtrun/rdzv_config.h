#pragma once

// --rdzv-conf, typed. torchrun takes a free-form "k=v,k=v" map and reads it
// with float()/int() wherever a key is used; dtrun parses it once, with the
// other flags, so a typo or a bad value exits 2 naming the key and the value.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/util/status.h"

namespace dtrun::agent {

// The typed --rdzv-conf. Plain data, filled by ParseRdzvConf on main's
// thread and read-only afterwards.
struct RdzvConfig {
  // Time a round may take to gather --nnodes' minimum (s; default 600).
  std::chrono::milliseconds join_timeout{600000};
  // Once the minimum joined, how long more nodes may still join (s; default
  // 30).
  std::chrono::milliseconds last_call_timeout{30000};
  // How often each node beats in the rendezvous store (s; default 1:
  // torchrun's 5 would leave a silent node running for 15 s; on etcd the
  // beats are a lease's renewals).
  std::chrono::milliseconds keep_alive_interval{1000};
  // Beats a node may miss before the others declare it dead (default 3: a
  // silent node is dead after 3 s).
  int keep_alive_max_attempt = 3;
  // Bound on one store operation (s); default: the silent limit, at least 1 s.
  std::optional<std::chrono::milliseconds> read_timeout;
  // c10d backend: host the rendezvous store here; default: whether the
  // endpoint names this host (then a taken port means: join as a client).
  std::optional<bool> is_host;
  // etcd-v2 backend, as torchrun's etcd backends take them: "http" or
  // "https", the CA bundle members are checked against, and this node's
  // client certificate and key (PEM files, checked readable here).
  std::string protocol = "http";
  bool protocol_given = false;
  std::string cacert, cert, key;
  // etcd's own authentication: `user`, with the password read from the
  // file `password_file` (its first line; a password on the command line
  // would show in every process listing).
  std::string user, password_file;
  // `timeout`: torchrun's etcd backend's join timeout (s); other backends
  // ignore it (it also lands in `ignored`).
  std::optional<std::chrono::milliseconds> timeout;
  bool join_timeout_given = false;
  // Keys torchrun accepts that dtrun does not use, as "key=value" (warned
  // about).
  std::vector<std::string> ignored;

  bool etcd_keys_given() const {
    return protocol_given || !cacert.empty() || !cert.empty() || !key.empty() ||
           !user.empty() || !password_file.empty();
  }
  // How long a node may stay silent before the others declare it dead.
  std::chrono::milliseconds silent_limit() const {
    return keep_alive_interval * keep_alive_max_attempt;
  }
};

// Parses "k=v,k=v" ("" gives the defaults). Status::Invalid names the key and
// the value at fault and what is accepted; an unknown key is an error, a
// torchrun key dtrun ignores goes to `ignored`. Pure.
Result<RdzvConfig> ParseRdzvConf(const std::string& text);

// torchrun's keys that dtrun accepts and ignores, with why (for README and
// the warning).
const std::vector<std::pair<std::string, std::string>>& IgnoredRdzvKeys();

}  // namespace dtrun::agent
