#include "cli/client_verbs.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "absl/time/clock.h"
#include "cli/admin_verbs.h"
#include "cli/credentials.h"
#include "cli/demo.h"
#include "cli/output.h"
#include "common/clock.h"
#include "common/host_port.h"
#include "common/http_client.h"
#include "model/model_ref.h"
#include "model/types.h"
#include "rpc/rpc.h"

namespace minions::cli {
namespace {

// A verb's failure; one that could not reach the server says where it looked and what to do.
int Fail(const Connection& connection, const absl::Status& status) {
  if (absl::IsUnavailable(status) && absl::StartsWith(status.message(), rpc::kUnreachable)) {
    fprintf(stderr, "error: %s\n%s\n", std::string(status.message()).c_str(), UnreachableHint(connection).c_str());
    return 1;
  }
  return ::minions::cli::Fail(status);
}

// The model as the job names it. A GGUF file named relative to here becomes its absolute path: the
// executors resolve a relative path against their model folders, not against this directory
// (a pool's executors share this machine's files; the server refuses, at submit, a path in none
// of the fleet's folders). A relative path with no file here is left to the executors' folders.
std::string ModelArgument(const std::string& model) {
  absl::StatusOr<ModelRef> ref = ParseModelRef(model);
  if (!ref.ok() || !ref->is_path || model[0] == '/') return model;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model, ec)) return model;
  std::filesystem::path absolute = std::filesystem::absolute(model, ec);
  return ec ? model : absolute.lexically_normal().string();
}

std::string Age(int64_t since_ms) {
  if (since_ms <= 0) return "-";
  return HumanDuration(static_cast<double>(absl::ToUnixMillis(absl::Now()) - since_ms) / 1000.0);
}

void PrintJobLine(const v1::Job& job) {
  const auto& c = job.request_counts();
  // Each "done/total" one string, right-aligned under its header as the other numbers are.
  const std::string records = absl::StrCat(c.completed() + c.failed(), "/", c.total());
  const std::string tasks = absl::StrCat(job.tasks_done(), "/", job.n_tasks());
  printf("%-18s %-11s %17s %7lld %11s %6s\n", job.id().c_str(), job.state().c_str(), records.c_str(),
         static_cast<long long>(c.failed()), tasks.c_str(), Age(job.created_at_ms()).c_str());
}

// Done counts the records of running attempts too (records_in_flight): the bar moves per record.
std::string ProgressLine(const v1::JobProgress& p, int columns) {
  const auto& c = p.job().request_counts();
  int64_t done = std::min(c.total(), c.completed() + c.failed() + p.records_in_flight());
  return ProgressText(done, c.total(), p.records_per_second(), p.eta_seconds(),
                      absl::StrCat("executors ", p.executors_working(), "  ", p.job().state()), columns);
}

// What `watch` says when Ctrl-C stops it (set before the watch starts; written by the handler,
// which may call only async-signal-safe functions).
char watch_stop_message[400];
void SayTheJobKeepsRunning(int) {
  ssize_t unused = write(STDERR_FILENO, watch_stop_message, strlen(watch_stop_message));
  (void)unused;
  _exit(130);
}

}  // namespace

int TerminalColumns(int fd) {
  struct winsize size {};
  if (ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

std::string ProgressText(int64_t done, int64_t total, double rate, double eta_seconds, const std::string& tail,
                         int columns) {
  const double fraction = total > 0 ? std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0) : 0;
  const std::string eta = eta_seconds < 0 ? "?" : HumanDuration(eta_seconds);
  const std::string figures = absl::StrFormat("%lld/%lld %3.0f%%  %.1f rec/s  ETA %s", static_cast<long long>(done),
                                              static_cast<long long>(total), fraction * 100, rate, eta);
  std::string rest = tail.empty() ? figures : absl::StrCat(figures, "  ", tail);
  // The bar takes what the figures leave, 10 to 30 wide; on a narrower terminal the line is cut,
  // never wrapped (a wrapped line would scroll a new line at every redraw).
  int width = 30;
  if (columns > 0) width = std::clamp(columns - 1 - static_cast<int>(rest.size()) - 3, 10, 30);
  const int filled = static_cast<int>(fraction * width);
  std::string line = absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '-'), "] ", rest);
  if (columns > 0 && static_cast<int>(line.size()) > columns - 1) line.resize(std::max(columns - 1, 1));
  return line;
}

std::string HumanDuration(double seconds) {
  if (seconds < 0) return "-";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

void Connection::FromEnvironment() {
  if (const char* t = std::getenv("MINIONS_TOKEN"); t && *t && token.empty()) token = t;
  if (const char* f = std::getenv("MINIONS_TOKEN_FILE"); f && *f && token_file.empty()) token_file = f;
  if (const char* ca = std::getenv("MINIONS_CA"); ca && *ca && tls.ca_file.empty()) tls.ca_file = ca;
}

namespace {

// `text` after a label of `indent` columns, words wrapped to fit 80 columns, continuation lines
// indented as far (status's lines: "sizing    ..."). A command it suggests ("minions ..." up to
// the word ending in ';', ')' or ',') stays on one line, to be copied whole.
std::string WrappedAfterLabel(const std::string& text, size_t indent) {
  constexpr size_t kWidth = 80;
  std::vector<std::string> units;
  bool in_command = false;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (in_command) {
      units.back() += " " + std::string(word);
    } else {
      units.emplace_back(word);
      in_command = word == "minions" || word == "(minions";
    }
    if (in_command && absl::string_view(";),").find(word.back()) != absl::string_view::npos) in_command = false;
  }
  std::string out, line;
  for (const std::string& unit : units) {
    if (!line.empty() && indent + line.size() + 1 + unit.size() > kWidth) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    if (!line.empty()) line += ' ';
    line += unit;
  }
  return out + line;
}

// Whether `server` answers HTTP (a server's HTTP port: dashboard, metrics, /v1), not gRPC: one GET
// of /healthz, any answer counts.
bool AnswersHttp(const Connection& connection) {
  RealClock clock;
  HttpClient::Options options;
  options.max_attempts = 1;
  options.connect_timeout = absl::Seconds(3);
  HttpClient http(&clock, options);
  for (const char* scheme : {"http://", "https://"}) {
    HttpClient::Request request;
    request.url = absl::StrCat(scheme, connection.server, "/healthz");
    if (http.Exchange(request).reached) return true;
  }
  return false;
}

}  // namespace

std::string UnreachableHint(const Connection& connection) {
  if (AnswersHttp(connection)) {
    return absl::StrCat("  Something answers at ", connection.server, " (from ", connection.server_source,
                        "), but over HTTP: that is a server's HTTP port\n"
                        "  (dashboard, /metrics, the OpenAI API). The CLI talks to its gRPC port: the server's "
                        "--listen\n  (minions up: 127.0.0.1:7070; its HTTP port is 127.0.0.1:7080).");
  }
  if (connection.server_source == "the default") {
    return absl::StrCat("  Nothing answers at ", connection.server,
                        ", the default address. To start a pool on this machine: minions up\n"
                        "  (or see it all work at once: minions demo). For a server elsewhere: --server HOST:PORT,\n"
                        "  MINIONS_SERVER, or [executor] server in a config file (MINIONS_CONFIG).");
  }
  return absl::StrCat("  Nothing answers at ", connection.server, " (from ", connection.server_source,
                      "). Is a server running there? minions server starts one;\n"
                      "  minions up runs a whole pool on this machine.");
}

absl::StatusOr<OpenConnection> Open(const Connection& connection) {
  OpenConnection open;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = rpc::OpenChannel(connection.server, connection.tls);
  if (!channel.ok()) return channel.status();
  open.channel = *std::move(channel);
  // A file named explicitly wins over the environment's token (cli/credentials.h).
  if (!connection.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(connection.token_file);
    if (!token.ok()) return token.status();
    open.token = *token;
  } else if (!connection.token.empty()) {
    open.token = connection.token;
  } else if (absl::StatusOr<std::string> keychain = KeychainToken(connection.server); keychain.ok()) {
    open.token = *keychain;
  } else if (IsLoopbackAddress(connection.server)) {
    for (const std::string& file : LocalAdminTokenFiles(MinionsHome())) {
      if (!TokenBelongsTo(file, connection.server)) continue;  // another listener: never its token
      absl::StatusOr<std::string> token = ReadTokenFile(file);
      if (token.ok()) {
        open.token = *token;
        break;
      }
      if (absl::IsFailedPrecondition(token.status())) return token.status();  // there, but readable by others
    }
  }
  return open;
}

JobsClient::JobsClient(const Connection& connection) : client_(connection) {}

absl::StatusOr<v1::Job> SubmitJob(v1::Jobs::StubInterface& stub, const std::string& token,
                                  v1::SubmitJobRequest request, absl::Duration timeout) {
  if (static_cast<int64_t>(request.input().size()) > kMaxInlineInputBytes) {
    grpc::ClientContext context;
    rpc::Prepare(context, token, timeout);
    v1::UploadInputResponse uploaded;
    std::unique_ptr<grpc::ClientWriterInterface<v1::UploadInputRequest>> writer =
        stub.UploadInput(&context, &uploaded);
    const std::string_view input = request.input();
    for (size_t at = 0; at < input.size(); at += kInputPartBytes) {
      v1::UploadInputRequest part;
      if (at == 0) part.set_team(request.team());
      part.set_data(std::string(input.substr(at, kInputPartBytes)));
      if (!writer->Write(part)) break;  // the server ended the call: Finish says why
    }
    writer->WritesDone();
    if (absl::Status s = rpc::FromGrpc(writer->Finish()); !s.ok()) return s;
    request.clear_input();
    request.set_input_key(uploaded.input_key());
  }
  grpc::ClientContext context;
  rpc::Prepare(context, token, timeout);
  v1::Job job;
  if (absl::Status s = rpc::FromGrpc(stub.SubmitJob(&context, request, &job)); !s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Job> JobsClient::Submit(const v1::SubmitJobRequest& request) {
  if (!client_.open().ok()) return client_.open();
  return SubmitJob(client_.stub(), client_.token(), request);
}

absl::StatusOr<v1::Job> JobsClient::Get(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  return client_.Call(&v1::Jobs::Stub::GetJob, request, v1::Job());
}

absl::StatusOr<std::vector<v1::Job>> JobsClient::List(const std::string& state, int limit) {
  v1::ListJobsRequest request;
  request.set_state(state);
  request.set_limit(limit);
  auto reply = client_.Call(&v1::Jobs::Stub::ListJobs, request, v1::ListJobsResponse());
  if (!reply.ok()) return reply.status();
  return std::vector<v1::Job>(reply->jobs().begin(), reply->jobs().end());
}

absl::StatusOr<v1::Job> JobsClient::Cancel(const std::string& job_id) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  return client_.Call(&v1::Jobs::Stub::CancelJob, request, v1::Job());
}

absl::StatusOr<std::vector<v1::Executor>> JobsClient::Executors() {
  auto reply = client_.Call(&v1::Jobs::Stub::ListExecutors, v1::ListExecutorsRequest(), v1::ListExecutorsResponse());
  if (!reply.ok()) return reply.status();
  return std::vector<v1::Executor>(reply->executors().begin(), reply->executors().end());
}

absl::StatusOr<std::vector<v1::Team>> JobsClient::Teams() {
  auto reply = client_.Call(&v1::Jobs::Stub::ListTeams, v1::ListTeamsRequest(), v1::ListTeamsResponse());
  if (!reply.ok()) return reply.status();
  return std::vector<v1::Team>(reply->teams().begin(), reply->teams().end());
}

absl::StatusOr<v1::Executor> JobsClient::Drain(const std::string& executor_id) {
  v1::DrainExecutorRequest request;
  request.set_executor_id(executor_id);
  return client_.Call(&v1::Jobs::Stub::DrainExecutor, request, v1::Executor());
}

absl::StatusOr<std::vector<v1::Task>> JobsClient::Tasks(const std::string& job_id) {
  std::vector<v1::Task> tasks;
  std::string page_token;
  do {  // page by page: a job of 50,000 tasks is not one message
    v1::ListTasksRequest request;
    request.set_job_id(job_id);
    request.set_page_token(page_token);
    auto reply = client_.Call(&v1::Jobs::Stub::ListTasks, request, v1::ListTasksResponse());
    if (!reply.ok()) return reply.status();
    tasks.insert(tasks.end(), reply->tasks().begin(), reply->tasks().end());
    page_token = reply->next_page_token();
  } while (!page_token.empty());
  return tasks;
}

absl::Status JobsClient::Results(const std::string& job_id, bool errors,
                                 const std::function<void(const std::string&)>& sink) {
  if (!client_.open().ok()) return client_.open();
  grpc::ClientContext context;
  rpc::Prepare(context, client_.token(), absl::InfiniteDuration());
  v1::GetResultsRequest request;
  request.set_job_id(job_id);
  request.set_errors(errors);
  auto reader = client_.stub().GetResults(&context, request);
  v1::ResultsChunk chunk;
  while (reader->Read(&chunk)) sink(chunk.data());
  return rpc::FromGrpc(reader->Finish());
}

absl::StatusOr<v1::Job> JobsClient::Watch(const std::string& job_id, absl::Duration interval,
                                          const std::function<void(const v1::JobProgress&)>& on_progress) {
  if (!client_.open().ok()) return client_.open();
  grpc::ClientContext context;
  rpc::Prepare(context, client_.token(), absl::InfiniteDuration());
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_interval_ms(absl::ToInt64Milliseconds(interval));
  auto reader = client_.stub().WatchJob(&context, request);
  v1::JobProgress progress;
  v1::Job last;
  while (reader->Read(&progress)) {
    last = progress.job();
    on_progress(progress);
  }
  if (auto s = rpc::FromGrpc(reader->Finish()); !s.ok()) return s;
  return last;
}

int Submit(const Connection& connection, const SubmitOptions& options) {
  errno = 0;
  std::ifstream in(options.input_path, std::ios::binary | std::ios::ate);
  if (!in || std::filesystem::is_directory(options.input_path)) return Fail(CannotRead(options.input_path, errno));
  // The server's limit, checked before anything is read or sent, with what to do about it.
  const int64_t size = static_cast<int64_t>(in.tellg());
  if (size > kDefaultMaxInputBytes) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is %.1f MiB; a job takes at most %d MiB of input: split it into several jobs by lines "
        "(split -l 100000 %s part-, then minions submit each part)",
        options.input_path, static_cast<double>(size) / (1 << 20), kDefaultMaxInputBytes >> 20, options.input_path)));
  }
  in.seekg(0);
  v1::SubmitJobRequest request;
  // Read into the request itself: one copy of the input in memory, not three.
  std::string* input = request.mutable_input();
  input->resize(static_cast<size_t>(size));
  if (size > 0 && !in.read(input->data(), size)) return Fail(CannotRead(options.input_path, errno));
  request.set_model(ModelArgument(options.model));
  request.set_shard_size(options.shard_size);
  request.set_max_attempts(options.max_attempts);
  request.set_priority(options.priority);
  request.set_team(options.team);
  request.set_runner_options_json(options.runner_options_json);
  request.set_runner(options.runner);
  request.set_gang_size(options.gang);
  request.set_require_confined(options.require_confined);
  if (!options.completion_window.empty()) {
    absl::Duration window;
    if (!absl::ParseDuration(options.completion_window, &window) || window <= absl::ZeroDuration()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--completion-window '", options.completion_window,
                                                          "' is not a positive duration such as 24h or 90m")));
    }
    request.set_completion_window_ms(absl::ToInt64Milliseconds(window));
  }
  JobsClient client(connection);
  auto job = client.Submit(request);
  if (!job.ok()) return Fail(connection, job.status());
  if (options.json && !options.wait) {
    printf("%s\n", ToJson(*job).c_str());
  } else {
    printf("%s\n", job->id().c_str());
  }
  fflush(stdout);
  if (!options.wait) return 0;
  return Watch(connection, job->id(), options.json);
}

int ListJobs(const Connection& connection, const std::string& state, bool json) {
  auto jobs = JobsClient(connection).List(state, 100);
  if (!jobs.ok()) return Fail(connection, jobs.status());
  if (json) {
    printf("[");
    for (size_t i = 0; i < jobs->size(); ++i) printf("%s%s", i ? "," : "", ToJson((*jobs)[i]).c_str());
    printf("]\n");
    return 0;
  }
  printf("%-18s %-11s %17s %7s %11s %6s\n", "JOB", "STATE", "RECORDS", "FAILED", "TASKS", "AGE");
  for (const auto& job : *jobs) PrintJobLine(job);
  return 0;
}

int Status(const Connection& connection, const std::string& job_id, bool json, bool tasks) {
  JobsClient client(connection);
  auto job = client.Get(job_id);
  if (!job.ok()) return Fail(connection, job.status());
  if (json) {
    printf("%s\n", ToJson(*job).c_str());
    return 0;
  }
  const auto& c = job->request_counts();
  printf("job       %s\nstate     %s\nmodel     %s\nrecords   %lld total, %lld completed, %lld failed\n"
         "tasks     %lld of %lld done (shard size %lld)\ncreated   %s ago\n",
         job->id().c_str(), job->state().c_str(), job->model().c_str(), static_cast<long long>(c.total()),
         static_cast<long long>(c.completed()), static_cast<long long>(c.failed()),
         static_cast<long long>(job->tasks_done()), static_cast<long long>(job->n_tasks()),
         static_cast<long long>(job->shard_size()), Age(job->created_at_ms()).c_str());
  if (!job->sizing().empty()) printf("sizing    %s\n", WrappedAfterLabel(job->sizing(), 10).c_str());
  if (job->finished_at_ms() > 0 && job->started_at_ms() > 0) {
    printf("ran       %s\n", HumanDuration((job->finished_at_ms() - job->started_at_ms()) / 1000.0).c_str());
  }
  if (job->device_seconds() > 0) {
    printf("device    %s (every attempt that has ended)\n", HumanDuration(job->device_seconds()).c_str());
  }
  if (job->has_prompt_tokens() && job->has_completion_tokens()) {
    // Reasoning is a part of the completion, named only when there is some.
    const std::string reasoning =
        job->reasoning_tokens() > 0 ? absl::StrCat(" (", job->reasoning_tokens(), " of them reasoning)") : "";
    printf("tokens    %lld prompt, %lld completion%s (what its answers say they used)\n",
           static_cast<long long>(job->prompt_tokens()), static_cast<long long>(job->completion_tokens()),
           reasoning.c_str());
  }
  if (const v1::VerificationCounts& v = job->verification(); v.checked() > 0) {
    // Spot checks by re-scoring on other executors (docs/verification.md).
    printf("verified  %lld records re-scored by %d other executors: %lld passed, %lld failed%s\n",
           static_cast<long long>(v.checked()), v.verifiers_size(), static_cast<long long>(v.passed()),
           static_cast<long long>(v.failed()), v.failed() > 0 ? " (their producer is quarantined)" : "");
    printf("          by %s\n", absl::StrJoin(v.verifiers(), ", ").c_str());
  }
  if (const v1::VerificationCounts& v = job->verification(); v.open_checks() > 0) {
    const bool published = job->state() == "completed" || job->state() == "expired";
    printf("unverified %lld spot checks open: %s\n", static_cast<long long>(v.open_checks()),
           published ? "it published without them (no other executor judged them in time); a later verdict still counts"
                     : "it publishes once other executors judge them, or after the server's verify wait");
  }
  if (const v1::VerificationCounts& v = job->verification(); v.failed_after_publication_size() > 0) {
    // Published before the verdict: its files keep the quarantined producer's answers.
    printf("notice    failed re-scoring after it published: %s\n",
           WrappedAfterLabel(absl::StrJoin(v.failed_after_publication(), ", "), 10).c_str());
    printf("          %lld of its records came from that quarantined executor and were not redone; run them "
           "again\n",
           static_cast<long long>(v.records_of_quarantined()));
  }
  if (!job->error().empty()) printf("error     %s\n", WrappedAfterLabel(job->error(), 10).c_str());
  if (!job->wait_reason().empty()) printf("waiting   %s\n", WrappedAfterLabel(job->wait_reason(), 10).c_str());
  if (job->gang_size() > 0) {
    printf("gang      %d executors per task\n", job->gang_size());
    // The gangs running its tasks now: each with its leader first.
    auto fleet = client.Executors();
    if (fleet.ok()) {
      std::map<std::string, std::vector<std::string>> gangs;  // "index#attempt" -> executors, leader first
      for (const auto& e : *fleet) {
        if (e.gang().rfind(job_id + "/", 0) != 0) continue;
        auto& seats = gangs[e.gang().substr(job_id.size() + 1)];
        if (e.gang_leader() == e.id()) {
          seats.insert(seats.begin(), e.id() + " (leader)");
        } else {
          seats.push_back(e.id());
        }
      }
      for (const auto& [task, seats] : gangs) printf("          task %s: %s\n", task.c_str(), absl::StrJoin(seats, ", ").c_str());
    }
  }
  if (job->state() == "completed" || job->state() == "expired" || job->state() == "cancelled") {
    printf("results   minions results %s -o output.jsonl   (errors: --errors)\n", job->id().c_str());
    if (job->state() == "cancelled") {
      // Its counts are what ran; the rest never did, and each has an error line.
      const int64_t never_ran = std::max<int64_t>(0, c.total() - c.completed() - c.failed());
      printf("          what finished is kept; the %lld records that never ran have error lines (batch_cancelled)\n",
             static_cast<long long>(never_ran));
    } else if (job->state() == "expired") {
      printf("          what finished is kept; each record that never ran has an error line (batch_expired)\n");
    }
  }
  if (tasks) {
    auto list = client.Tasks(job_id);
    if (!list.ok()) return Fail(connection, list.status());
    printf("\n%6s %-10s %8s %9s %9s %-16s %s\n", "TASK", "STATE", "ATTEMPT", "RECORDS", "FAILED", "EXECUTOR", "LAST ERROR");
    for (const auto& t : *list) {
      printf("%6lld %-10s %8d %9lld %9lld %-16s %s\n", static_cast<long long>(t.index()), t.state().c_str(),
             t.attempt(), static_cast<long long>(t.n_records()), static_cast<long long>(t.records_failed()),
             t.executor_id().c_str(), t.last_error().c_str());
    }
  }
  return 0;
}

int Watch(const Connection& connection, const std::string& job_id, bool json) {
  bool tty = isatty(STDOUT_FILENO) && !json;
  // Ctrl-C stops the watching, not the job: say so, and how to come back or stop it.
  snprintf(watch_stop_message, sizeof watch_stop_message,
           "\nstopped watching; job %.40s keeps running (minions watch %.40s follows it again, minions cancel "
           "%.40s stops it)\n",
           job_id.c_str(), job_id.c_str(), job_id.c_str());
  std::signal(SIGINT, SayTheJobKeepsRunning);
  // Not a terminal (a log, a pipe): a line when something changed, at most every 5 seconds.
  absl::Time last_printed = absl::InfinitePast();
  int64_t last_done = -1;
  std::string last_state;
  auto last = JobsClient(connection).Watch(job_id, absl::Milliseconds(500), [&](const v1::JobProgress& p) {
    const auto& c = p.job().request_counts();
    int64_t done = c.completed() + c.failed() + p.records_in_flight();
    if (json) {
      printf("%s\n", ToJson(p).c_str());
    } else if (tty) {
      // Fitted to the terminal as it is now (it may have been resized), the rest of the old line
      // cleared.
      printf("\r%s\033[K", ProgressLine(p, TerminalColumns(STDOUT_FILENO)).c_str());
    } else if (p.job().state() != last_state ||
               (done != last_done && absl::Now() - last_printed >= absl::Seconds(5))) {
      printf("%s\n", ProgressLine(p, 0).c_str());
      last_printed = absl::Now();
      last_done = done;
      last_state = p.job().state();
    }
    fflush(stdout);
  });
  if (tty) printf("\n");
  if (!last.ok()) return Fail(connection, last.status());
  if (!json) {
    printf("job %s %s", last->id().c_str(), last->state().c_str());
    if (!last->error().empty()) printf(": %s", last->error().c_str());
    printf("\n");
  }
  return last->state() == "completed" ? 0 : 1;
}

int Results(const Connection& connection, const std::string& job_id, const std::string& output_path, bool errors) {
  FILE* out = stdout;
  std::string tmp;
  if (!output_path.empty()) {
    tmp = output_path + ".part";
    out = fopen(tmp.c_str(), "wb");
    if (!out) return Fail(absl::PermissionDeniedError(absl::StrCat("cannot write '", output_path, "'")));
  }
  auto status = JobsClient(connection).Results(job_id, errors, [&](const std::string& chunk) {
    fwrite(chunk.data(), 1, chunk.size(), out);
  });
  if (out != stdout) {
    fclose(out);
    if (status.ok()) {
      std::rename(tmp.c_str(), output_path.c_str());
    } else {
      std::remove(tmp.c_str());
    }
  }
  if (!status.ok()) return Fail(connection, status);
  return 0;
}

int Cancel(const Connection& connection, const std::string& job_id, bool json) {
  auto job = JobsClient(connection).Cancel(job_id);
  if (!job.ok()) return Fail(connection, job.status());
  return PrintAnswer(*job, json, [](const v1::Job& j) { printf("job %s %s\n", j.id().c_str(), j.state().c_str()); });
}

int ListTeams(const Connection& connection, bool json) {
  auto teams = JobsClient(connection).Teams();
  if (!teams.ok()) return Fail(connection, teams.status());
  PrintTeams(*teams, json);
  return 0;
}

int ListExecutors(const Connection& connection, bool json) {
  auto executors = JobsClient(connection).Executors();
  if (!executors.ok()) return Fail(connection, executors.status());
  if (json) {
    printf("[");
    for (size_t i = 0; i < executors->size(); ++i) printf("%s%s", i ? "," : "", ToJson((*executors)[i]).c_str());
    printf("]\n");
    return 0;
  }
  printf("%-16s %-16s %-12s %-24s %9s %9s %-8s %10s  %s\n", "EXECUTOR", "NAME", "STATE", "DEVICE", "MEMORY", "USABLE",
         "CONFINED", "HEARTBEAT", "MODELS | TASKS (WHY)");
  for (const auto& e : *executors) {
    std::string tasks;
    for (const auto& t : e.current_tasks()) tasks += (tasks.empty() ? "" : " ") + t;
    // Why an executor is not working, as far as the server says (never why an owner is present).
    if (!e.state_reason().empty()) tasks += (tasks.empty() ? "(" : " (") + e.state_reason() + ")";
    // Gangs: which gang it sits in, and whether it leads it or whom it serves.
    if (!e.gang().empty()) {
      tasks += (tasks.empty() ? "" : " ") + std::string("[gang ") + e.gang() +
               (e.gang_leader() == e.id() ? ", leader]" : ", member of " + e.gang_leader() + "]");
    }
    // Cached models as NAME@short digest (the server's naming); the loaded one starred.
    std::string models;
    for (int i = 0; i < e.models_cached_size(); ++i) {
      const std::string& digest = e.models_cached(i);
      const std::string shown = i < e.models_shown_size() ? e.models_shown(i) : digest.substr(0, 19);
      models += (models.empty() ? "" : " ") + shown + (digest == e.model_loaded() ? "*" : "");
    }
    if (models.empty()) models = "-";
    const std::string device =
        e.gpu().empty() ? absl::StrCat(e.accelerator().empty() ? "cpu" : e.accelerator(), " ", e.os())
                        : absl::StrCat(e.accelerator(), " ", e.gpu());
    // No dangling "|" for an executor with no task and nothing to say.
    if (!tasks.empty()) models += " | " + tasks;
    // Every field is the server's word, some of it executors' own: control characters are shown
    // escaped, never sent to the terminal.
    // How its runners are confined (full, partial: seccomp only, none); "?": it does not say.
    const std::string line = absl::StrFormat(
        "%-16s %-16s %-12s %-24s %8.1fG %8.1fG %-8s %10s  %s", e.id(), e.name(), e.state(), device.substr(0, 24),
        static_cast<double>(e.memory_bytes()) / (1 << 30), static_cast<double>(e.usable_memory_bytes()) / (1 << 30),
        e.confinement().empty() ? "?" : e.confinement().substr(0, 8), Age(e.last_heartbeat_at_ms()) + " ago", models);
    printf("%s\n", EscapeControlCharacters(line).c_str());
  }
  return 0;
}

int DrainExecutor(const Connection& connection, const std::string& executor_id, bool json) {
  auto executor = JobsClient(connection).Drain(executor_id);
  if (!executor.ok()) return Fail(connection, executor.status());
  return PrintAnswer(*executor, json, [](const v1::Executor& e) {
    printf("executor %s will finish its current task and take no more\n", e.id().c_str());
  });
}

}  // namespace minions::cli
