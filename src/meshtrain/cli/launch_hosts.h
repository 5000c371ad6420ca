// The hosts and processes of a job `meshtrain launch` supervises (cli/launch.cpp): the hosts
// file, the slots a job may use, child processes with their output passed through, and the
// probe that asks a host whether it answers.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

namespace meshtrain::cli {

struct Host {
  std::string name;
  int slots = 1;
  bool up = true;  // answered the last probe (a host not yet probed is down)
  int held = 0;    // slots held back after their rank failed while the host answered
  int usable() const { return up ? (slots > held ? slots - held : 0) : 0; }
};

// OpenMPI's hostfile syntax, the part a launcher needs: `NAME [slots=N]` per line, `#` comments.
// Throws UsageError saying the file, the line and what to write. The hosts come in the file's
// order.
std::vector<Host> read_hosts(const std::string& path);
// Moves the hosts that are this machine (by name, or by an address of its interfaces: a name
// lookup per host, so once, at the start) to the front, keeping the order otherwise: mpirun
// fills its own host's slots first, whatever the order of --host, and the launcher must know
// which host each rank runs on.
void this_machine_first(std::vector<Host>& hosts);
// The usable slots of all hosts.
int capacity(const std::vector<Host>& hosts);
// mpirun's --host list of the usable slots the first `ranks` ranks fill, host by host as
// --map-by slot places them: "a:2,b:1". Slots beyond them are left out: OpenMPI's runtime
// fails to route to a host in its list that gets no rank ("ORTE does not know how to route").
std::string hosts_text(const std::vector<Host>& hosts, int ranks);

struct Spawned {
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends of its stdout and stderr (-1: sent to /dev/null)
};
// Starts `program args...` (PATH searched) in a process group of its own, stdin from /dev/null;
// its stdout and stderr on pipes (capture) or to /dev/null. Throws UsageError when it cannot.
Spawned spawn(const std::string& program, const std::vector<std::string>& args, bool capture);
// Waits for the process: its exit code, or 128 + the signal that ended it.
int wait_code(pid_t pid);
// Copies everything read from `fd` to `to` as it comes, keeping the last `keep` bytes in `tail`.
void pass_through(int fd, std::FILE* to, std::string& tail, size_t keep);

// Whether each host of `which` answers: a one-process `mpirun --host H:1 -np 1 true` there
// within `timeout_s`, all asked at once.
std::vector<bool> probe_all(const std::string& mpirun, const std::vector<std::string>& which, double timeout_s);

}  // namespace meshtrain::cli
