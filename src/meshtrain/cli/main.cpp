// meshtrain: the command-line program. Subcommands are filled in by the cli/ files.
#include <cstdio>

int main(int argc, char** argv) {
  std::puts("meshtrain: no subcommands yet");
  return 0;
}
