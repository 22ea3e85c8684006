// dtrun's own requests on reserved keys (store_state.h), which PyTorch's
// store serves as plain keys or not at all: the binding of a connection
// whose close the store counts, and a rendezvous joiner's entry in one
// request. Split from store_client.cc, which speaks c10d's protocol.
#include <algorithm>
#include <cctype>
#include <string>

#include "rendezvous/store_client.h"
#include "rendezvous/store_state.h"

namespace dtrun::rendezvous {

Status TcpStoreClient::BindOnClose(const std::string& closes,
                                   const std::string& binds) {
  std::lock_guard<std::mutex> lock(mu_);
  on_close_ = closes;
  on_bind_ = binds;
  return Bind(false);
}

Result<Store::Enlisted> TcpStoreClient::Enlist(const Enlistment& e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (enlist_known_) {
      std::string reply;
      Status s = Call(
          MakeRequest(Op::kCompareSet, {K(kEnlistKey)},
                      {K(e.counter), K(e.records) + "\n" +
                                         (e.closes.empty() ? "" : K(e.closes)) +
                                         "\n" + e.record}),
          "enlist in '" + e.counter + "'", kLengthPrefixed, &reply);
      if (!s.ok()) return s;
      // The slot in decimal; torch's store answers the counter's name.
      const bool slot = !reply.empty() && reply.size() < 19 &&
                        std::all_of(reply.begin(), reply.end(), ::isdigit);
      if (slot) {
        if (!e.closes.empty()) {
          on_close_ = e.closes + reply;
          on_bind_ = e.rebinds + reply;
        }
        return Enlisted{std::stoll(reply), !e.closes.empty()};
      }
      enlist_known_ = false;
    }
  }
  return Store::Enlist(e);
}

// The binding first: counted as bound only once the store will count the
// close. With mu_ held (Open runs inside a call); right after a connect,
// so a failure here closes the connection and goes no deeper. The first
// binding is implied (GoneOf counts one): joining costs one request.
Status TcpStoreClient::Bind(bool again) {
  // The key bound is the one on the wire (with c10d's "/"), as the ADD
  // the store makes on the close must hit what this client reads.
  Status s =
      Call(MakeRequest(Op::kSet, {K(kOnCloseKey)},
                       {on_close_.empty() ? std::string() : K(on_close_)}),
           "bind the on-close key", 0, nullptr);
  std::string reply;
  if (s.ok() && again && !on_bind_.empty())
    s = Call(MakeRequest(Op::kAdd, {K(on_bind_)}, {}, 1),
             "add to key '" + on_bind_ + "'", 8, &reply);
  return s;
}

}  // namespace dtrun::rendezvous
