// libnss_dtrunprobe.so.2: an nsswitch.conf hosts module for the static
// binaries' name lookup test. Loading it appends the loading process's
// binary to $DTRUN_NSS_PROBE_LOG; it resolves one name, probe-only-host, to
// 127.0.0.1, so a lookup that needs it shows whether the module ran.
#include <arpa/inet.h>
#include <netdb.h>
#include <nss.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

__attribute__((constructor)) void Loaded() {
  const char* log = std::getenv("DTRUN_NSS_PROBE_LOG");
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (!log || n <= 0) return;
  exe[n] = '\0';
  if (FILE* f = std::fopen(log, "a")) {
    std::fprintf(f, "%s\n", exe);
    std::fclose(f);
  }
}

}  // namespace

extern "C" nss_status _nss_dtrunprobe_gethostbyname2_r(const char* name, int af,
                                                       hostent* h, char* buf,
                                                       size_t len, int* errnop,
                                                       int* h_errnop) {
  if (std::strcmp(name, "probe-only-host") != 0 || af != AF_INET) {
    *errnop = ENOENT;
    *h_errnop = HOST_NOT_FOUND;
    return NSS_STATUS_NOTFOUND;
  }
  // buf holds the address list (one address, then null), the alias list
  // (null), the address and the name, as glibc's modules lay them out.
  size_t need = 3 * sizeof(char*) + 4 + std::strlen(name) + 1;
  if (len < need) {
    *errnop = ERANGE;
    *h_errnop = NETDB_INTERNAL;
    return NSS_STATUS_TRYAGAIN;
  }
  char** lists = reinterpret_cast<char**>(buf);
  char* address = buf + 3 * sizeof(char*);
  char* copy = address + 4;
  inet_pton(AF_INET, "127.0.0.1", address);
  std::strcpy(copy, name);
  lists[0] = address;
  lists[1] = nullptr;
  lists[2] = nullptr;
  h->h_name = copy;
  h->h_aliases = &lists[2];
  h->h_addrtype = AF_INET;
  h->h_length = 4;
  h->h_addr_list = lists;
  return NSS_STATUS_SUCCESS;
}

extern "C" nss_status _nss_dtrunprobe_gethostbyname_r(const char* name,
                                                      hostent* h, char* buf,
                                                      size_t len, int* errnop,
                                                      int* h_errnop) {
  return _nss_dtrunprobe_gethostbyname2_r(name, AF_INET, h, buf, len, errnop,
                                          h_errnop);
}
