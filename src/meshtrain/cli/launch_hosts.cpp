#include "meshtrain/cli/launch_hosts.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "meshtrain/cli/commands.h"

extern char** environ;

namespace meshtrain::cli {

using Clock = std::chrono::steady_clock;

// ---- hosts ----
namespace {
// Whether `name` is this machine: "localhost", its host name, or a name or address that
// resolves to an address of one of its interfaces.
bool is_this_machine(const std::string& name) {
  if (name == "localhost") return true;
  char self[256] = {};
  if (gethostname(self, sizeof self - 1) == 0 && name == self) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) return false;
  ifaddrs* ifs = nullptr;
  bool local = false;
  if (getifaddrs(&ifs) == 0) {
    for (const addrinfo* r = res; r && !local; r = r->ai_next)
      for (const ifaddrs* i = ifs; i && !local; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != r->ai_family) continue;
        if (r->ai_family == AF_INET)
          local = reinterpret_cast<const sockaddr_in*>(r->ai_addr)->sin_addr.s_addr ==
                  reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
        else if (r->ai_family == AF_INET6)
          local = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(r->ai_addr)->sin6_addr,
                              &reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr, sizeof(in6_addr)) == 0;
      }
    freeifaddrs(ifs);
  }
  freeaddrinfo(res);
  return local;
}
}  // namespace

void this_machine_first(std::vector<Host>& hosts) {
  std::stable_partition(hosts.begin(), hosts.end(), [](const Host& h) { return is_this_machine(h.name); });
}

std::vector<Host> read_hosts(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw UsageError("cannot read the hosts file '" + path + "': give a file with one host per line, e.g. `node1 slots=4`");
  static const std::regex name_re(R"([A-Za-z0-9][A-Za-z0-9._-]*)");
  std::vector<Host> hosts;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::string name, w;
    if (!(words >> name)) continue;
    const std::string where = "the hosts file '" + path + "', line " + std::to_string(n) + ": ";
    if (!std::regex_match(name, name_re))
      throw UsageError(where + "'" + name + "' is not a host name (letters, digits, '.', '-', '_')");
    Host h{name};
    while (words >> w) {
      static const std::regex slots_re(R"(slots=(\d{1,5}))");
      std::smatch m;
      if (!std::regex_match(w, m, slots_re) || std::stoi(m[1].str()) < 1)
        throw UsageError(where + "'" + w + "' is not understood; a line is a host name and optionally slots=N (N at least 1)");
      h.slots = std::stoi(m[1].str());
    }
    for (const Host& o : hosts)
      if (o.name == h.name) throw UsageError(where + "host '" + h.name + "' is listed twice; give it once with its slots");
    hosts.push_back(h);
  }
  if (f.bad()) throw UsageError("could not read the hosts file '" + path + "'");
  if (hosts.empty())
    throw UsageError("the hosts file '" + path + "' names no host: write one host per line, e.g. `node1 slots=4`");
  return hosts;
}

int capacity(const std::vector<Host>& hosts) {
  int n = 0;
  for (const Host& h : hosts) n += h.usable();
  return n;
}

std::string hosts_text(const std::vector<Host>& hosts, int ranks) {
  std::string s;
  for (const Host& h : hosts) {
    const int n = std::min(h.usable(), ranks);
    if (n <= 0) continue;
    s += (s.empty() ? "" : ",") + h.name + ":" + std::to_string(n);
    ranks -= n;
  }
  return s;
}

// ---- child processes ----
Spawned spawn(const std::string& program, const std::vector<std::string>& args, bool capture) {
  std::vector<std::string> full{program};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : full) argv.push_back(s.data());
  argv.push_back(nullptr);
  int err_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (capture) {
    if (pipe(err_pipe) != 0 || pipe(out_pipe) != 0) throw std::runtime_error("launch: cannot make pipes for the child");
    posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
    posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
    posix_spawn_file_actions_addclose(&fa, err_pipe[0]);
    posix_spawn_file_actions_addclose(&fa, out_pipe[0]);
  } else {
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  }
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  // Its own process group, so a terminal's Ctrl-C reaches the launcher alone (which passes it on
  // as the graceful stop) and a probe left behind can be killed whole.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, program.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (capture) {
    close(err_pipe[1]);
    close(out_pipe[1]);
  }
  if (rc != 0) {
    if (capture) {
      close(err_pipe[0]);
      close(out_pipe[0]);
    }
    throw UsageError("launch: cannot start '" + program + "' (" + std::strerror(rc) + ")" +
                     (program.find("mpirun") != std::string::npos ? "; install OpenMPI (Debian: openmpi-bin) or give --mpirun PATH" : ""));
  }
  return {pid, capture ? out_pipe[0] : -1, capture ? err_pipe[0] : -1};
}

int wait_code(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Whether `host` answers: a one-process mpirun there that runs `true`, within `timeout_s`.
namespace {
bool probe(const std::string& mpirun, const std::string& host, double timeout_s) {
  Spawned p;
  try {
    p = spawn(mpirun, {"--host", host + ":1", "-np", "1", "true"}, /*capture=*/false);
  } catch (const std::exception&) {
    return false;
  }
  const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int status = 0;
    const pid_t w = waitpid(p.pid, &status, WNOHANG);
    if (w == p.pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (w < 0 && errno != EINTR) return false;
    if (Clock::now() > until) {
      kill(-p.pid, SIGKILL);
      wait_code(p.pid);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

std::vector<bool> probe_all(const std::string& mpirun, const std::vector<std::string>& which, double timeout_s) {
  std::vector<char> ok(which.size(), 0);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < which.size(); ++i)
    ts.emplace_back([&, i] { ok[i] = probe(mpirun, which[i], timeout_s) ? 1 : 0; });
  for (auto& t : ts) t.join();
  return {ok.begin(), ok.end()};
}

void pass_through(int fd, std::FILE* to, std::string& tail, size_t keep) {
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) {
    std::fwrite(buf, 1, static_cast<size_t>(n), to);
    std::fflush(to);
    tail.append(buf, static_cast<size_t>(n));
    if (tail.size() > keep) tail.erase(0, tail.size() - keep);
  }
}

}  // namespace meshtrain::cli
