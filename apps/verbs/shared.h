#pragma once
// What the verb groups of `minions` share (apps/minions_main.cc registers them): the flags bound
// to every verb that takes them, the options several verbs add alike, and the stop signals.
// The verb groups: each Add* registers its verbs' options into its struct (bound by reference, so
// a struct must outlive the parse); each Run* runs the verb that was parsed. main() calls them in
// the order the verbs are listed by --help.

#include <string>

#include "CLI/CLI.hpp"
#include "cli/client_verbs.h"
#include "cli/demo.h"
#include "runner/protocol.h"

namespace minions::apps {

// What the verb groups share: one variable each for the connection to the server, --json and
// --config, bound to every verb that takes it.
struct SharedFlags {
  minions::cli::Connection connection;
  bool json = false;
  std::string home = minions::cli::MinionsHome();
  std::string config_path;
};

void AddLoadOptions(CLI::App* cmd, minions::runner_protocol::LoadOptions* load);
void AddServerAddress(CLI::App* cmd, minions::cli::Connection* connection);
// --server, --ca, --token-file and --token; and --config, unless the command has one already
// (`config_path` null).
void AddConnection(CLI::App* cmd, minions::cli::Connection* connection, std::string* config_path);

// SIGTERM and SIGINT are counted from here on (the processes that run until stopped).
void InstallSignalHandlers();
// How many of them arrived so far.
int SignalsReceived();

}  // namespace minions::apps
