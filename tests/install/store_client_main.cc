// Built by install_test.sh against an installed dtrun with nothing but
// `pkg-config --cflags --libs dtrun-store`: sets, adds and reads keys on the
// store at HOST PORT. Prints "store client: OK value=V counter=C"; exits 1
// with the store's message on any failure.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "rendezvous/store_client.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
    return 2;
  }
  dtrun::rendezvous::StoreClientOptions opts;
  opts.host = argv[1];
  opts.port = static_cast<uint16_t>(std::atoi(argv[2]));
  auto client = dtrun::rendezvous::TcpStoreClient::Connect(opts);
  if (!client.ok()) {
    std::fprintf(stderr, "store client: %s\n",
                 client.status().message().c_str());
    return 1;
  }
  auto set = (*client)->Set("greeting", "hello");
  auto added = (*client)->Add("counter", 41);
  if (added.ok()) added = (*client)->Add("counter", 1);
  auto got = (*client)->Get("greeting");
  if (!set.ok() || !added.ok() || !got.ok()) {
    const auto& bad = !set.ok()     ? set
                      : !added.ok() ? added.status()
                                    : got.status();
    std::fprintf(stderr, "store client: %s\n", bad.message().c_str());
    return 1;
  }
  std::printf("store client: OK value=%s counter=%lld\n", got->c_str(),
              static_cast<long long>(*added));
  return 0;
}
