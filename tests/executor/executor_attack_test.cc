// The attack suite of issue 17 on the executor's side: a real `minions executor` process against a
// malicious control plane (an in-process gRPC server that hands out poisoned leases). One test per
// attack: file:// URLs that leave the objects folder (by path, "..", a symbolic link), hosts that
// are not the object store, models outside the model folders (one answer whatever the file), and
// a subverted runner that looks for the owner's secrets. Each asserts the refusal, that the
// target was not touched, and that the executor goes on serving honest leases.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/json_util.h"
#include "common/subprocess.h"
#include "executor/model_access.h"
#include "minions/v1/minions.grpc.pb.h"
#include "sandbox/sandbox.h"

namespace minions::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

const std::string kBin = MINIONS_TEST_BIN_DIR;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// What an executor reported about one task.
struct Report {
  bool completed = false;
  std::string failure_class;
  std::string message;
};

// A control plane that serves the leases it is given, one per Lease call, and records reports.
class MaliciousServer final : public v1::Executors::Service {
 public:
  void Offer(v1::TaskLease lease) {
    absl::MutexLock lock(&mu_);
    offers_.push_back(std::move(lease));
  }
  // A gang duty for the next Lease answer.
  void OfferDuty(v1::GangDuty duty) {
    absl::MutexLock lock(&mu_);
    duties_.push_back(std::move(duty));
  }
  // Duties not yet handed out, and the most any heartbeat reported serving.
  size_t DutiesLeft() {
    absl::MutexLock lock(&mu_);
    return duties_.size();
  }
  int MostDutiesReported() {
    absl::MutexLock lock(&mu_);
    return most_duties_reported_;
  }
  std::optional<Report> WaitFor(int64_t task, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reports_.count(task) > 0; };
    mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
    if (!reports_.count(task)) return std::nullopt;
    return reports_[task];
  }

  // Enrolment: the executor trades its join token for this credential (it then presents it on
  // every call; this server checks nothing).
  grpc::Status Enrol(grpc::ServerContext*, const v1::EnrolRequest*, v1::EnrolResponse* reply) override {
    reply->set_executor_id("exe-target");
    reply->set_credential("mne_the-executors-own-credential");
    reply->set_lease_ttl_ms(60000);
    return grpc::Status::OK;
  }
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*, v1::RegisterResponse* reply) override {
    reply->set_executor_id("exe-target");
    reply->set_lease_ttl_ms(60000);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* reply) override {
    reply->set_lease_ttl_ms(60000);
    absl::MutexLock lock(&mu_);
    most_duties_reported_ = std::max(most_duties_reported_, request->gang_duties_size());
    return grpc::Status::OK;
  }
  grpc::Status Lease(grpc::ServerContext*, const v1::LeaseRequest*, v1::LeaseResponse* reply) override {
    reply->set_lease_ttl_ms(60000);
    absl::MutexLock lock(&mu_);
    auto offered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !offers_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&offered), absl::Milliseconds(200));
    if (!offers_.empty()) {
      *reply->add_leases() = offers_.front();
      offers_.pop_front();
    }
    for (v1::GangDuty& duty : duties_) *reply->add_gang_duties() = std::move(duty);
    duties_.clear();
    return grpc::Status::OK;
  }
  grpc::Status Complete(grpc::ServerContext*, const v1::CompleteRequest* request, v1::CompleteResponse*) override {
    Record(request->ref().task_index(), Report{true, "", ""});
    return grpc::Status::OK;
  }
  grpc::Status CompleteBatch(grpc::ServerContext*, const v1::CompleteBatchRequest* request,
                             v1::CompleteBatchResponse* reply) override {
    for (const auto& ref : request->refs()) {
      Record(ref.task_index(), Report{true, "", ""});
      reply->add_outcomes()->set_code(0);
    }
    return grpc::Status::OK;
  }
  grpc::Status Fail(grpc::ServerContext*, const v1::FailRequest* request, v1::FailResponse*) override {
    Record(request->ref().task_index(), Report{false, request->failure_class(), request->message()});
    return grpc::Status::OK;
  }

 private:
  void Record(int64_t task, Report report) {
    absl::MutexLock lock(&mu_);
    reports_.emplace(task, std::move(report));
  }
  absl::Mutex mu_;
  std::deque<v1::TaskLease> offers_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::GangDuty> duties_ ABSL_GUARDED_BY(mu_);
  int most_duties_reported_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, Report> reports_ ABSL_GUARDED_BY(mu_);
};

// A TCP listener on loopback that counts the connections it is offered.
class Listener {
 public:
  Listener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    listen(fd_, 16);
  }
  ~Listener() { close(fd_); }
  int port() const { return port_; }
  // Connections waiting to be accepted (none expected).
  int Pending() {
    int n = 0;
    for (int c; (c = accept(fd_, nullptr, nullptr)) >= 0; ++n) close(c);
    return n;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class ExecutorAttackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("minions-exec-attack-" + std::to_string(getpid()))).string();
    fs::remove_all(dir_);
    for (const char* sub : {"objects/inputs", "models", "home/.ssh", "victim", "state"}) fs::create_directories(dir_ + "/" + sub);
    objects_ = dir_ + "/objects";
    models_ = dir_ + "/models";
    std::ofstream(objects_ + "/inputs/in.jsonl") << R"({"custom_id":"a","prompt":"hello"})" << "\n"
                                                 << R"({"custom_id":"b","prompt":"world"})" << "\n";
    input_size_ = static_cast<int64_t>(fs::file_size(objects_ + "/inputs/in.jsonl"));
    std::ofstream(models_ + "/tiny.gguf") << "GGUF";
    std::ofstream(dir_ + "/home/.ssh/id_rsa") << "-----BEGIN OPENSSH PRIVATE KEY-----";
    std::ofstream(dir_ + "/victim/precious.txt") << "precious";
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&server_);
    grpc_ = builder.BuildAndStart();
    ASSERT_NE(grpc_, nullptr);
  }
  void TearDown() override {
    if (executor_) {
      executor_->Signal(SIGKILL);
      (void)executor_->Wait(absl::Seconds(10));
    }
    if (grpc_) grpc_->Shutdown(std::chrono::system_clock::now());
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // `objects`: the executor's --objects (default: the objects folder, as a pool on one machine).
  void StartExecutor(const std::string& runner, const std::vector<std::string>& extra = {},
                     const std::string& objects = "") {
    Subprocess::Options sp;
    sp.argv = {kBin + "/minions", "executor", "--server", absl::StrCat("127.0.0.1:", port_), "--name", "target",
               "--state-dir", dir_ + "/state", "--runner", runner, "--runner-log", dir_ + "/runner.log",
               "--availability", "off", "--objects", objects.empty() ? "file://" + objects_ : objects,
               "--models", models_};
    // Its join token, in a file only it reads (its credential goes into its state folder).
    const std::string join_file = dir_ + "/join-token";
    {
      std::ofstream(join_file) << "mnj_the-executors-join-secret\n";
      fs::permissions(join_file, fs::perms::owner_read | fs::perms::owner_write);
    }
    sp.argv.insert(sp.argv.end(), {"--join-token-file", join_file});
    sp.argv.insert(sp.argv.end(), extra.begin(), extra.end());
    // The executor's own secrets: no runner may see them.
    sp.extra_env = {"MINIONS_TOKEN=the-executors-own-secret"};
    sp.stderr_path = dir_ + "/executor.log";
    auto started = Subprocess::Start(sp);
    ASSERT_TRUE(started.ok()) << started.status();
    executor_ = std::move(*started);
    executor_->CloseStdin();
  }

  // A lease of task `index` on the input's two records, writing to objects/out-<index>.
  v1::TaskLease Lease(int64_t index, const std::string& model = "") {
    v1::TaskLease lease;
    lease.mutable_ref()->set_job_id("job-attack");
    lease.mutable_ref()->set_task_index(index);
    lease.mutable_ref()->set_attempt(1);
    lease.set_n_records(2);
    lease.set_input_url("file://" + objects_ + "/inputs/in.jsonl");
    lease.set_byte_begin(0);
    lease.set_byte_end(input_size_);
    lease.set_model(model.empty() ? models_ + "/tiny.gguf" : model);
    lease.set_runner("llama");
    v1::ChunkUrls* urls = lease.add_chunk_urls();
    urls->set_output_url(absl::StrCat("file://", objects_, "/out-", index, ".jsonl"));
    urls->set_errors_url(absl::StrCat("file://", objects_, "/err-", index, ".jsonl"));
    return lease;
  }

  Report MustReport(int64_t task) {
    std::optional<Report> report;
    for (int i = 0; i < 60 && !report && executor_ && executor_->running(); ++i) {
      report = server_.WaitFor(task, absl::Seconds(1));
    }
    if (!report) {
      ADD_FAILURE() << "no report of task " << task << "; executor log:\n" << ReadAll(dir_ + "/executor.log");
      return Report{};
    }
    return *report;
  }

  // Where a lease's URL goes: its input, or its first chunk's output.
  static void SetInput(v1::TaskLease& lease, const std::string& url) { lease.set_input_url(url); }
  static void SetOutput(v1::TaskLease& lease, const std::string& url) {
    lease.mutable_chunk_urls(0)->set_output_url(url);
  }

  // Offers one lease a URL, tasks `first_index` on, with `urls[i]` set by `set`: each report says
  // the task failed with `phrase`; `also` checks more of each report.
  void ExpectEachRefused(const std::vector<std::string>& urls, int64_t first_index,
                         void (*set)(v1::TaskLease&, const std::string&), const std::string& phrase,
                         const std::function<void(const Report&)>& also = nullptr) {
    for (size_t i = 0; i < urls.size(); ++i) {
      const int64_t index = first_index + static_cast<int64_t>(i);
      v1::TaskLease lease = Lease(index);
      set(lease, urls[i]);
      server_.Offer(lease);
      Report report = MustReport(index);
      SCOPED_TRACE(urls[i]);
      EXPECT_FALSE(report.completed);
      EXPECT_THAT(report.message, HasSubstr(phrase));
      if (also) also(report);
    }
  }

  // The executor still serves an honest lease after the attacks.
  void ExpectStillServes(int64_t index) {
    server_.Offer(Lease(index));
    Report honest = MustReport(index);
    EXPECT_TRUE(honest.completed) << honest.message;
    EXPECT_EQ(ReadAll(absl::StrCat(objects_, "/out-", index, ".jsonl")).empty(), false);
  }

  std::string dir_, objects_, models_;
  int64_t input_size_ = 0;
  int port_ = 0;
  MaliciousServer server_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<Subprocess> executor_;
};

// Whether something accepts TCP connections on 127.0.0.1:`port` now.
bool ListensOnLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return connected;
}

// A server answer that makes a member serve a gang (GangDuty) names where its gate listens
// (`bind`): it must be the executor's own gang address, which the server only copies. llama.cpp's
// rpc-server has no authentication, so a wrong or hostile answer that moved the gate to another
// port, to every interface or to another address would expose it: each is refused, nothing
// listens there (nor on the executor's own gang port), no duty is reported, and the executor goes
// on serving honest leases.
TEST_F(ExecutorAttackTest, AGangDutyThatBindsAnythingButTheExecutorsOwnGangAddressIsRefused) {
  const int own = Listener().port();
  const int other = Listener().port();
  StartExecutor(kBin + "/minions-noop-runner", {"--gang-address", absl::StrCat("127.0.0.1:", own)});
  const std::vector<std::string> binds = {absl::StrCat("127.0.0.1:", other), absl::StrCat("0.0.0.0:", own),
                                          absl::StrCat("[::]:", own), absl::StrCat("127.0.0.2:", own)};
  for (size_t i = 0; i < binds.size(); ++i) {
    v1::GangDuty duty;
    duty.mutable_ref()->set_job_id("job-gang");
    duty.mutable_ref()->set_task_index(static_cast<int64_t>(i));
    duty.mutable_ref()->set_attempt(1);
    duty.set_leader_host("127.0.0.1");
    duty.set_bind(binds[i]);
    server_.OfferDuty(duty);
  }
  // The duties went out with a Lease answer before this honest lease's (answers are taken in turn).
  ExpectStillServes(7);
  EXPECT_EQ(server_.DutiesLeft(), 0u);
  const std::string log = ReadAll(dir_ + "/executor.log");
  for (const std::string& bind : binds) {
    EXPECT_THAT(log, HasSubstr(absl::StrCat("cannot serve its gang: the duty binds ", bind,
                                            ", not this executor's gang address 127.0.0.1:", own)));
  }
  EXPECT_FALSE(ListensOnLoopback(other));
  EXPECT_FALSE(ListensOnLoopback(own));
  EXPECT_THAT(log, Not(HasSubstr("serving the gang of leader")));
  EXPECT_EQ(server_.MostDutiesReported(), 0);
}

// An executor followed any file:// URL it was handed and replaced that file with output lines.
TEST_F(ExecutorAttackTest, FileUrlsOutsideTheObjectsFolderAreNeitherReadNorWritten) {
  StartExecutor(kBin + "/minions-noop-runner");
  const std::string victim = dir_ + "/victim/precious.txt";
  fs::create_directory_symlink(dir_ + "/victim", objects_ + "/shortcut");
  // Reading: by path, by "..", by a link inside the objects folder, the folder itself.
  std::vector<std::string> reads = {"file://" + victim, "file://" + objects_ + "/../victim/precious.txt",
                                    "file://" + objects_ + "/shortcut/precious.txt", "file://" + objects_,
                                    "file:///etc/passwd", "file://localhost/etc/passwd"};
  ExpectEachRefused(reads, 0, SetInput, "refused to read");
  // Writing: the output URL points at the victim, directly, by "..", and through the link.
  std::vector<std::string> writes = {"file://" + victim, "file://" + objects_ + "/../victim/precious.txt",
                                     "file://" + objects_ + "/shortcut/precious.txt",
                                     "file://" + dir_ + "/victim/new-file.txt"};
  ExpectEachRefused(writes, 100, SetOutput, "refused to write");
  EXPECT_EQ(ReadAll(victim), "precious");
  EXPECT_FALSE(fs::exists(dir_ + "/victim/new-file.txt"));
  ExpectStillServes(200);
}

// Hosts other than the object store's are never contacted: not another port, not another host.
TEST_F(ExecutorAttackTest, UrlsOnOtherHostsAreRefusedBeforeAnyConnection) {
  Listener listener;
  Listener allowed;  // the "object store": a different port on the same host
  StartExecutor(kBin + "/minions-noop-runner", {}, absl::StrCat("http://127.0.0.1:", allowed.port()));
  std::vector<std::string> urls = {
      absl::StrCat("http://127.0.0.1:", listener.port(), "/bucket/in.jsonl?X-Amz-Signature=x"),
      absl::StrCat("https://127.0.0.1:", allowed.port(), "/bucket/in.jsonl"),  // another scheme
      absl::StrCat("http://user:pw@127.0.0.1:", allowed.port(), "/bucket/in.jsonl"),
      "https://evil.example/steal", "gopher://127.0.0.1:70/x", "ftp://127.0.0.1/x",
      absl::StrCat("http://127.0.0.1:", allowed.port(), "/in.jsonl#@evil.example"),
  };
  ExpectEachRefused(urls, 0, SetInput, "refused", [](const Report& report) {
    EXPECT_THAT(report.message, Not(HasSubstr("X-Amz-Signature")));
  });
  EXPECT_EQ(listener.Pending(), 0);
  EXPECT_EQ(allowed.Pending(), 0);
  // file:// is not among this executor's locations at all now.
  v1::TaskLease lease = Lease(50);
  server_.Offer(lease);
  EXPECT_THAT(MustReport(50).message, HasSubstr("file:// URLs are not among this executor's object locations"));
}

// `/etc/shadow` got "not a GGUF file", `~/.ssh/id_rsa` "does not exist": a job could probe the
// owner's files. Now every model outside the model folders gets the same answer.
TEST_F(ExecutorAttackTest, AModelOutsideTheModelFoldersGetsOneAnswerWhateverTheFile) {
  StartExecutor(kBin + "/minions-noop-runner");
  fs::create_symlink(dir_ + "/home/.ssh/id_rsa", models_ + "/innocent.gguf");
  fs::create_directory(models_ + "/a-folder");
  std::vector<std::string> models = {"/etc/shadow",
                                     dir_ + "/home/.ssh/id_rsa",
                                     dir_ + "/home/.ssh/missing",
                                     models_ + "/innocent.gguf",
                                     models_ + "/../home/.ssh/id_rsa",
                                     "../home/.ssh/id_rsa",
                                     models_ + "/a-folder",
                                     models_ + "/missing.gguf",
                                     "/proc/self/environ"};
  std::set<std::string> answers;
  for (size_t i = 0; i < models.size(); ++i) {
    server_.Offer(Lease(static_cast<int64_t>(i), models[i]));
    Report report = MustReport(static_cast<int64_t>(i));
    SCOPED_TRACE(models[i]);
    EXPECT_FALSE(report.completed);
    EXPECT_THAT(report.message, HasSubstr(ModelAccess::UnavailableMessage(models[i])));
    answers.insert(absl::StrReplaceAll(report.message, {{models[i], "<model>"}}));
  }
  EXPECT_EQ(answers.size(), 1u) << *answers.begin();
  // A model in the folder, by path and by name, loads.
  ExpectStillServes(100);
  server_.Offer(Lease(101, "tiny.gguf"));
  EXPECT_TRUE(MustReport(101).completed);
}

bool HaveLandlock() { return sandbox::LandlockAbi() >= 1; }

// The runner inherited MINIONS_TOKEN; a subverted one could read anything of the owner's and
// send it anywhere. Now it starts with an empty environment, inside the sandbox.
TEST_F(ExecutorAttackTest, ASubvertedRunnerFindsNoSecretAndReachesNothing) {
  Listener listener;
  std::ofstream(dir_ + "/home/secret.txt") << "the owner's secret";
  StartExecutor(std::string(MINIONS_SOURCE_DIR) + "/tests/runners/snooping_runner.py",
                {"--runner-env", "SNOOP_FILE=" + dir_ + "/home/secret.txt", "--runner-env",
                 absl::StrCat("SNOOP_PORT=", listener.port()), "--runner-env",
                 "SNOOP_WRITE=" + dir_ + "/victim/pwned.txt"});
  server_.Offer(Lease(0));
  Report report = MustReport(0);
  ASSERT_TRUE(report.completed) << report.message << "\n" << ReadAll(dir_ + "/runner.log");
  std::string output = ReadAll(objects_ + "/out-0.jsonl");
  auto line = ParseJson(output.substr(0, output.find('\n')));
  ASSERT_TRUE(line.ok()) << output;
  const Json& seen = (*line)["response"]["body"];
  // Its environment: only what the executor gives every runner (and --runner-env); LC_CTYPE is
  // Python's own (PEP 538).
  for (const Json& name : seen["environment"]) {
    EXPECT_TRUE(name == "HOME" || name == "TMPDIR" || name == "LC_CTYPE") << seen.dump();
  }
  EXPECT_THAT(output, Not(HasSubstr("the-executors-own-secret")));
  EXPECT_THAT(output, Not(HasSubstr("the-executors-own-credential")));
  EXPECT_THAT(output, Not(HasSubstr("the-executors-join-secret")));
  EXPECT_THAT(seen["tcp_connect"].get<std::string>(), StartsWith("refused"));
  EXPECT_THAT(seen["udp_socket"].get<std::string>(), StartsWith("refused"));
  EXPECT_EQ(listener.Pending(), 0);
  EXPECT_THAT(seen["write_scratch"].get<std::string>(), StartsWith("ALLOWED"));
  if (!HaveLandlock()) GTEST_SKIP() << "this kernel has no Landlock: the file rules are not enforced here";
  EXPECT_THAT(seen["read_secret"].get<std::string>(), StartsWith("refused"));
  EXPECT_THAT(seen["read_passwd"].get<std::string>(), StartsWith("refused"));
  EXPECT_THAT(seen["parent_environ"].get<std::string>(), StartsWith("refused"));
  EXPECT_THAT(seen["write_outside"].get<std::string>(), StartsWith("refused"));
  EXPECT_FALSE(fs::exists(dir_ + "/victim/pwned.txt"));
}

}  // namespace
}  // namespace minions::testing
