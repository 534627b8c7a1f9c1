#include "verbs/client.h"

#include "cli/admin_verbs.h"
#include "cli/credentials.h"

namespace minions::apps {
namespace {

// `minions executors release ID`: an admin lifts a quarantine (docs/verification.md).
void AddReleaseVerb(CLI::App* executors_cmd, SharedFlags* shared, ClientVerbs* c) {
  auto* release = c->release_executor_cmd = executors_cmd->add_subcommand(
      "release", "put a quarantined executor (an answer of its failed verification) back in service");
  release->add_option("executor", c->executor_id, "executor id")->required();
  AddConnection(release, &shared->connection, &shared->config_path);
  release->add_flag("--json", shared->json, "JSON output");
}

}  // namespace

void AddClientVerbs(CLI::App& app, SharedFlags* shared, ClientVerbs* c) {
  minions::cli::Connection& connection = shared->connection;
  std::string& config_path = shared->config_path;
  bool& json = shared->json;
  minions::cli::SubmitOptions& submit = c->submit;
  // A verb that speaks to the server (it takes the connection's flags), and one about one job.
  auto server_verb = [&](CLI::App* parent, const char* name, const char* description) {
    CLI::App* verb = parent->add_subcommand(name, description);
    AddConnection(verb, &connection, &config_path);
    return verb;
  };
  auto job_verb = [&](const char* name, const char* description) {
    CLI::App* verb = server_verb(&app, name, description);
    verb->add_option("job", c->job_id, "job id")->required();
    return verb;
  };
  auto* submit_cmd = c->submit_cmd = server_verb(&app, "submit", "submit a JSONL batch file; prints the job id");
  submit_cmd->add_option("file", submit.input_path, "OpenAI Batch request lines (JSONL)")->required();
  submit_cmd->add_option("--model", submit.model,
                         "a pushed model (NAME or NAME@sha256:...), or a GGUF path the executors can open")
      ->required();
  submit_cmd->add_option("--runner", submit.runner, "the runner that serves it (default llama; or one executors declare)");
  submit_cmd->add_option("--shard-size", submit.shard_size,
                         "records per task (default: the server sizes tasks to run about a minute, from the "
                         "measured throughput of the model; 100 when nothing was measured yet)");
  submit_cmd->add_option("--max-attempts", submit.max_attempts, "failures before a task fails (default 4)");
  submit_cmd->add_option("--priority", submit.priority, "higher runs first");
  submit_cmd->add_option("--team", submit.team, "owner team");
  submit_cmd->add_option("--parallel", c->parallel, "sequences each runner decodes together");
  submit_cmd->add_option("--runner-options", submit.runner_options_json, "runner load options as JSON");
  submit_cmd->add_option("--gang", submit.gang,
                         "run each task on a gang of N executors that split the model between them (2..17)");
  submit_cmd->add_flag("--require-confined", submit.require_confined,
                       "run it only on executors whose runners are fully confined (Landlock and seccomp); it waits "
                       "while none is");
  submit_cmd->add_option("--completion-window", submit.completion_window,
                         "deadline after submission (24h, 90m); the job then expires with what it finished");
  submit_cmd->add_flag("--wait", submit.wait, "watch the job until it ends");
  submit_cmd->add_flag("--json", submit.json, "JSON output");
  auto* jobs_cmd = c->jobs_cmd = server_verb(&app, "jobs", "list jobs, newest first");
  jobs_cmd->add_option("--state", c->state_filter, "only jobs in this state");
  jobs_cmd->add_flag("--json", json, "JSON output");
  auto* status_cmd = c->status_cmd = job_verb("status", "one job: state, request counts, where its results are");
  status_cmd->add_flag("--tasks", c->show_tasks, "list the job's tasks");
  status_cmd->add_flag("--json", json, "JSON output");
  c->watch_cmd = job_verb("watch", "progress bar with rate and ETA until the job ends");
  c->watch_cmd->add_flag("--json", json, "one JSON progress line per update");
  auto* results_cmd = c->results_cmd = job_verb("results", "the merged output (or error) file of a completed job");
  results_cmd->add_option("-o,--output", c->output_path, "file to write (default: standard output)");
  results_cmd->add_flag("--errors", c->errors, "the error file instead");
  c->cancel_cmd = job_verb("cancel", "cancel a job; executors stop its tasks within a heartbeat");
  c->cancel_cmd->add_flag("--json", json, "JSON output");
  auto* executors_cmd = c->executors_cmd =
      server_verb(&app, "executors", "the fleet: each executor's state and current tasks");
  executors_cmd->add_flag("--json", json, "JSON output");
  c->teams_cmd = server_verb(
      &app, "teams", "every team's fair-share weight, share, usage, running tasks and limits (no credentials shown)");
  c->teams_cmd->add_flag("--json", json, "JSON output");
  auto* revoke_executor_cmd = c->revoke_executor_cmd =
      executors_cmd->add_subcommand("revoke", "cut an executor off now: its credentials stop working, its tasks go back");
  revoke_executor_cmd->add_option("executor", c->executor_id, "executor id")->required();
  AddConnection(revoke_executor_cmd, &connection, &config_path);
  revoke_executor_cmd->add_flag("--json", json, "JSON output");
  AddReleaseVerb(executors_cmd, shared, c);
  auto* approve_executor_cmd = c->approve_executor_cmd = executors_cmd->add_subcommand(
      "approve", "let a pending executor (the server requires approval) take work");
  approve_executor_cmd->add_option("executor", c->executor_id, "executor id, or its name when only one pending has it")
      ->required();
  AddConnection(approve_executor_cmd, &connection, &config_path);
  approve_executor_cmd->add_flag("--json", json, "JSON output");
  // models: push, list, show, rm (a bare `minions models` lists).
  auto* models_cmd = c->models_cmd = server_verb(&app, "models", "the team's models: push a GGUF file, list, show, rm");
  models_cmd->add_option("--team", c->model.team, "the team (admins: any; default your credential's)");
  models_cmd->add_flag("--json", c->model.json, "JSON output");
  auto* push = c->models_push_cmd =
      models_cmd->add_subcommand("push", "upload a GGUF model for the team (resumable; the same bytes again are free)");
  push->add_option("file", c->model.path, "the GGUF file")->required();
  push->add_option("--name", c->model.name, "the name jobs use (--model NAME)")->required();
  auto* list = c->models_list_cmd = models_cmd->add_subcommand("list", "the team's models");
  auto* show = c->models_show_cmd = models_cmd->add_subcommand("show", "one model: what its header says, what a task needs");
  show->add_option("model", c->model.name, "NAME or NAME@sha256:...")->required();
  auto* rm = c->models_rm_cmd =
      models_cmd->add_subcommand("rm", "remove a model (every digest of NAME, or NAME@sha256:...); refused while a job needs it");
  rm->add_option("model", c->model.name, "NAME or NAME@sha256:...")->required();
  for (CLI::App* verb : {push, list, show, rm}) {
    AddConnection(verb, &connection, &config_path);
    verb->add_option("--team", c->model.team, "the team (admins: any; default your credential's)");
    verb->add_flag("--json", c->model.json, "JSON output");
  }
  auto* whoami_cmd = c->whoami_cmd =
      app.add_subcommand("whoami", "which credential this client presents, and what it may do");
  AddConnection(whoami_cmd, &connection, &config_path);
  whoami_cmd->add_flag("--json", json, "JSON output");
}

void AddDrainVerb(CLI::App& app, SharedFlags* shared, ClientVerbs* c) {
  auto* drain_cmd = c->drain_cmd = app.add_subcommand("drain", "ask an executor to finish its task and take no more");
  AddConnection(drain_cmd, &shared->connection, &shared->config_path);
  drain_cmd->add_option("executor", c->executor_id, "executor id")->required();
  drain_cmd->add_flag("--json", shared->json, "JSON output");
}

std::optional<int> RunClientVerb(ClientVerbs* c, const minions::cli::Connection& connection, bool json) {
  if (c->submit_cmd->parsed()) {
    if (c->parallel > 0 && c->submit.runner_options_json.empty()) {
      c->submit.runner_options_json = "{\"n_parallel\": " + std::to_string(c->parallel) + "}";
    }
    return minions::cli::Submit(connection, c->submit);
  }
  if (c->jobs_cmd->parsed()) return minions::cli::ListJobs(connection, c->state_filter, json);
  if (c->status_cmd->parsed()) return minions::cli::Status(connection, c->job_id, json, c->show_tasks);
  if (c->watch_cmd->parsed()) return minions::cli::Watch(connection, c->job_id, json);
  if (c->results_cmd->parsed()) return minions::cli::Results(connection, c->job_id, c->output_path, c->errors);
  if (c->cancel_cmd->parsed()) return minions::cli::Cancel(connection, c->job_id, json);
  if (c->revoke_executor_cmd->parsed()) {
    return minions::cli::RevokeExecutor(*minions::cli::RemoteAdmin(connection), c->executor_id, json);
  }
  if (c->release_executor_cmd->parsed()) {
    return minions::cli::ReleaseExecutor(*minions::cli::RemoteAdmin(connection), c->executor_id, json);
  }
  if (c->approve_executor_cmd->parsed()) {
    return minions::cli::ApproveExecutor(*minions::cli::RemoteAdmin(connection), connection, c->executor_id, json);
  }
  if (c->executors_cmd->parsed()) return minions::cli::ListExecutors(connection, json);
  if (c->teams_cmd->parsed()) return minions::cli::ListTeams(connection, json);
  if (c->models_cmd->parsed()) {
    c->model.json = c->model.json || json;
    if (c->models_push_cmd->parsed()) return minions::cli::PushModel(connection, c->model);
    if (c->models_show_cmd->parsed()) return minions::cli::ShowModel(connection, c->model);
    if (c->models_rm_cmd->parsed()) return minions::cli::RemoveModel(connection, c->model);
    return minions::cli::ListModels(connection, c->model);
  }
  if (c->whoami_cmd->parsed()) return minions::cli::WhoAmI(*minions::cli::RemoteAdmin(connection), json);
  return std::nullopt;
}

}  // namespace minions::apps
