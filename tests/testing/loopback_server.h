#pragma once

#include "rendezvous/store_server.h"

namespace dtrun::testing {

// Options for a store server on 127.0.0.1 and a free port.
inline rendezvous::StoreServerOptions LoopbackServerOptions() {
  rendezvous::StoreServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = 0;
  return opts;
}

}  // namespace dtrun::testing
