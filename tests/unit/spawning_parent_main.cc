// minions-test-spawning-parent: a process that starts a child through Subprocess, in a process
// group of its own (as an executor starts its runners and a gang member its rpc-server), prints
// "CHILD_PID LIFELINE_PID" on a line, and then starts another copy of the same child for every
// line it reads on stdin, printing the same, until the end of its stdin. subprocess_test.cc
// SIGKILLs it and watches whether the children (and what they started) die with it.
// Usage: minions-test-spawning-parent PROGRAM [ARGS...]
// MINIONS_TEST_DEATH_SIGNAL=N: the children's death signal (Subprocess::Options::death_signal).

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/subprocess.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: minions-test-spawning-parent PROGRAM [ARGS...]\n");
    return 2;
  }
  minions::Subprocess::Options options;
  options.argv.assign(argv + 1, argv + argc);
  options.own_process_group = true;
  if (const char* signal = getenv("MINIONS_TEST_DEATH_SIGNAL")) options.death_signal = atoi(signal);
  std::vector<std::unique_ptr<minions::Subprocess>> children;  // each killed when we return
  while (true) {
    auto child = minions::Subprocess::Start(options);
    if (!child.ok()) {
      fprintf(stderr, "error: %s\n", std::string(child.status().message()).c_str());
      return 1;
    }
    printf("%d %d\n", static_cast<int>((*child)->pid()), static_cast<int>(minions::Subprocess::LifelinePid()));
    fflush(stdout);
    children.push_back(std::move(*child));
    char byte = 0;
    ssize_t n;
    while ((n = read(STDIN_FILENO, &byte, 1)) > 0 && byte != '\n') {
    }
    if (n <= 0) return 0;
  }
}
