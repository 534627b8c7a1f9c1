// minions-test-spawning-parent: a process that starts one child through Subprocess, in a process
// group of its own (as an executor starts its runners and a gang member its rpc-server), prints
// the child's pid on a line and waits for the end of its stdin. subprocess_test.cc SIGKILLs it
// and watches whether the child dies with it.
// Usage: minions-test-spawning-parent PROGRAM [ARGS...]

#include <unistd.h>

#include <cstdio>
#include <string>

#include "common/subprocess.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: minions-test-spawning-parent PROGRAM [ARGS...]\n");
    return 2;
  }
  minions::Subprocess::Options options;
  options.argv.assign(argv + 1, argv + argc);
  options.own_process_group = true;
  auto child = minions::Subprocess::Start(options);
  if (!child.ok()) {
    fprintf(stderr, "error: %s\n", std::string(child.status().message()).c_str());
    return 1;
  }
  printf("%d\n", static_cast<int>((*child)->pid()));
  fflush(stdout);
  char byte;
  while (read(STDIN_FILENO, &byte, 1) > 0) {
  }
  return 0;  // the child's Subprocess kills it
}
