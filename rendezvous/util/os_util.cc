// The POSIX calls behind the helpers, each error turned into a Status that
// names the path and what the system said.
#include "rendezvous/util/os_util.h"

#include <fcntl.h>
#include <limits.h>
#include <ftw.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

namespace dtrun::os {

Status MakeDirs(const std::string& path) {
  // The folder itself first, and its parents only when one is missing: a
  // mkdir locks the parent folder even when the child exists, and hundreds
  // of agents making their folders at once would queue on "/" and /tmp.
  // EEXIST is fine (another process may be making the same folder at the
  // same moment, as ranks of one node do).
  if (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return Status::Ok();
  int err = errno;
  auto slash = path.find_last_not_of('/');
  slash = slash == std::string::npos ? slash : path.rfind('/', slash);
  // A parent is missing, or is not a folder: the parents say which.
  if ((err == ENOENT || err == ENOTDIR) && slash != std::string::npos &&
      slash > 0) {
    Status parent = MakeDirs(path.substr(0, slash));
    if (!parent.ok()) return parent;
    if (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return Status::Ok();
    err = errno;
  }
  return Status::Io("cannot create the folder '" + path +
                    "': " + std::strerror(err));
}

Result<std::string> MakeTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) {
    return Status::Io("cannot create a temporary folder '" + templ +
                      "': " + std::strerror(errno) +
                      "; set TMPDIR to a writable folder");
  }
  return std::string(buf.data());
}

void RemoveTree(const std::string& path) {
  // Depth first, without following links: a link to elsewhere is removed,
  // never what it points to. Folders (also unreadable ones, which rmdir
  // still removes when empty) by rmdir and the rest by unlink, so each entry
  // locks its parent once (remove() tries unlink first).
  nftw(
      path.c_str(),
      [](const char* p, const struct stat*, int type, FTW*) {
        bool folder = type == FTW_DP || type == FTW_DNR;
        return folder ? ::rmdir(p) : ::unlink(p);
      },
      16, FTW_DEPTH | FTW_PHYS);
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::Io("cannot read '" + path + "': " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string ReadFileOrEmpty(const std::string& path) {
  auto text = ReadFile(path);
  return text.ok() ? *text : std::string();
}

std::string ReadTail(const std::string& path, size_t lines) {
  std::vector<std::string> all;
  std::stringstream in(ReadFileOrEmpty(path));
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size();
       ++i) {
    out += all[i] + "\n";
  }
  return out;
}

Status WriteFile(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out)
    return Status::Io("cannot write '" + path + "': " + std::strerror(errno));
  return Status::Ok();
}

Status WriteDurably(
    const std::string& path,
    const std::function<Status(int fd, const std::string& tmp)>& fill) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status::Io("creating " + tmp + ": " + std::strerror(errno));
  }
  Status s = fill(fd, tmp);
  if (s.ok() && ::fsync(fd) != 0)
    s = Status::Io("fsync " + tmp + ": " + std::strerror(errno));
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    s = Status::Io("renaming " + tmp + ": " + std::strerror(errno));
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  SyncFolder(path.substr(0, path.rfind('/') + 1));
  return Status::Ok();
}

void SyncFolder(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(),
                        O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

std::string SelfExecutable() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string full = (dir.empty() ? "." : dir) + "/" + name;
    if (access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

char ProcessState(int pid) {
  // "pid (comm) S ...": comm may hold spaces and parentheses, so the state
  // is the first letter after the last ')'.
  std::string stat = ReadFileOrEmpty("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

std::string ProcessWaitChannel(int pid) {
  std::string wchan =
      ReadFileOrEmpty("/proc/" + std::to_string(pid) + "/wchan");
  return wchan == "0" ? "" : wchan;
}

bool IsNativeExecutable(const std::string& path) {
  if (access(path.c_str(), X_OK) != 0) return false;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {};
  bool elf = read(fd, magic, sizeof(magic)) == 4 && magic[0] == 0x7f &&
             magic[1] == 'E' && magic[2] == 'L' && magic[3] == 'F';
  close(fd);
  return elf;
}

std::string RandomHex(int digits) {
  static const char* kHex = "0123456789abcdef";
  std::mt19937_64 rng(std::random_device{}());
  std::string out;
  for (int i = 0; i < digits; ++i) out += kHex[rng() % 16];
  return out;
}

double UnixNow() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void RaiseFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

}  // namespace dtrun::os
