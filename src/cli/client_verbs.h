#pragma once
// The client verbs: submit, jobs, status, watch, results, cancel, executors, drain. Each prints
// for people by default and JSON with --json; each returns the process exit code.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "minions/v1/minions.grpc.pb.h"
#include "rpc/rpc.h"
#include "rpc/tls.h"

namespace minions::cli {

struct Connection {
  // --server, else MINIONS_SERVER, else [executor] server of the config file, else this default.
  std::string server = "127.0.0.1:7070";
  // Where `server` came from, as a person would look for it: "--server", "MINIONS_SERVER",
  // "[executor] server in FILE", "the default". Messages name it when the server cannot be reached.
  std::string server_source = "the default";
  std::string token;       // --token or MINIONS_TOKEN (else see cli/credentials.h)
  std::string token_file;  // --token-file or MINIONS_TOKEN_FILE
  rpc::ClientTls tls;      // --ca (MINIONS_CA), --tls-server-name
  // Fills the token, token file and CA from the environment where they are unset.
  void FromEnvironment();
};

// A channel to the connection's server and the credential to present, found as
// cli/credentials.h says. Errors: a token file others can read, a CA that cannot be read, plain
// text to another machine.
struct OpenConnection {
  std::shared_ptr<grpc::Channel> channel;
  std::string token;
};
absl::StatusOr<OpenConnection> Open(const Connection& connection);

// What a person should hear when a verb cannot reach the server at `connection`: the address
// tried, where it came from, and how to start a pool or point at another server.
std::string UnreachableHint(const Connection& connection);

// A connection to one gRPC service and the credential it presents, written once for every client
// the verbs use (JobsClient, ModelsClient, the admin verbs' remote backend). When the connection
// could not be opened, every call returns why.
// Threads: one caller at a time.
template <typename Service>
class ServiceClient {
 public:
  explicit ServiceClient(const Connection& connection) {
    absl::StatusOr<OpenConnection> open = Open(connection);
    if (!open.ok()) {
      open_ = open.status();
      return;
    }
    stub_ = Service::NewStub(open->channel);
    token_ = open->token;
  }

  // One unary call with the credential and a deadline `timeout` away; `reply` is the message to fill.
  template <typename Method, typename Request, typename Reply>
  absl::StatusOr<Reply> Call(Method method, const Request& request, Reply reply,
                             absl::Duration timeout = absl::Seconds(30)) {
    if (!open_.ok()) return open_;
    grpc::ClientContext context;
    rpc::Prepare(context, token_, timeout);
    grpc::Status status = ((*stub_).*method)(&context, request, &reply);
    if (!status.ok()) return rpc::FromGrpc(status);
    return reply;
  }

  // For streaming calls: why the connection is not open (OK when it is), the stub, the credential.
  const absl::Status& open() const { return open_; }
  typename Service::Stub& stub() { return *stub_; }
  const std::string& token() const { return token_; }

 private:
  absl::Status open_;
  std::unique_ptr<typename Service::Stub> stub_;
  std::string token_;
};

// A thin, status-returning wrapper of the Jobs service.
// Submits `request` through `stub` presenting `token`: an input larger than kMaxInlineInputBytes
// is first sent as a stream of parts (Jobs.UploadInput) and the job names the uploaded object, so
// no message is larger than the server's receive limit; a smaller one goes inline. Each call has
// a deadline `timeout` away.
absl::StatusOr<v1::Job> SubmitJob(v1::Jobs::StubInterface& stub, const std::string& token,
                                  v1::SubmitJobRequest request, absl::Duration timeout = absl::Minutes(10));

class JobsClient {
 public:
  explicit JobsClient(const Connection& connection);
  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> Get(const std::string& job_id);
  absl::StatusOr<std::vector<v1::Job>> List(const std::string& state, int limit);
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);
  absl::StatusOr<std::vector<v1::Executor>> Executors();
  absl::StatusOr<std::vector<v1::Team>> Teams();
  absl::StatusOr<v1::Executor> Drain(const std::string& executor_id);
  absl::StatusOr<std::vector<v1::Task>> Tasks(const std::string& job_id);
  // Streams the output (or error) file to `sink`.
  absl::Status Results(const std::string& job_id, bool errors, const std::function<void(const std::string&)>& sink);
  // Calls `on_progress` for each update until the job ends; returns the last job state.
  absl::StatusOr<v1::Job> Watch(const std::string& job_id, absl::Duration interval,
                                const std::function<void(const v1::JobProgress&)>& on_progress);

 private:
  ServiceClient<v1::Jobs> client_;
};

struct SubmitOptions {
  std::string input_path;
  std::string model;
  int64_t shard_size = 0;
  int max_attempts = 0;
  int priority = 0;
  std::string team;
  std::string runner_options_json;
  std::string runner;             // "" : llama
  std::string completion_window;  // "24h", "90m": the job expires with what it finished by then
  int gang = 0;                   // run each task on a gang of this many executors (0: one)
  bool require_confined = false;  // only on executors whose runners are fully confined
  bool wait = false;
  bool json = false;
};

int Submit(const Connection& connection, const SubmitOptions& options);
int ListJobs(const Connection& connection, const std::string& state, bool json);
int Status(const Connection& connection, const std::string& job_id, bool json, bool tasks);
int Watch(const Connection& connection, const std::string& job_id, bool json);
int Results(const Connection& connection, const std::string& job_id, const std::string& output_path, bool errors);
int Cancel(const Connection& connection, const std::string& job_id, bool json);
int ListExecutors(const Connection& connection, bool json);
// `minions teams`: every team's weight, share, usage, running tasks and limits (any credential
// that may see the fleet), printed as `minions admin teams` prints them.
int ListTeams(const Connection& connection, bool json);
int DrainExecutor(const Connection& connection, const std::string& executor_id, bool json);

// "1h02m", "45s", "-" — for tables and the progress bar.
std::string HumanDuration(double seconds);

// One line of progress, `watch`'s and `local-run`'s: "[####------] 367/1000  37%  12.5 rec/s
// ETA 51s  TAIL", at most `columns` - 1 wide (0: any width): the bar shrinks (to 10) before the
// line is cut. `eta_seconds` < 0: not known yet.
std::string ProgressText(int64_t done, int64_t total, double rate, double eta_seconds, const std::string& tail,
                         int columns);
// The width of the terminal on `fd` (80 when it does not say).
int TerminalColumns(int fd);

}  // namespace minions::cli
