// Gangs on loopback (docs/architecture.md, "Gangs"): the real minions-llama-runner spreads a model
// over real rpc-servers (llama.cpp's tools/rpc, run by GangMember behind its gate), reached
// through the leader's tunnels (GangTunnel: the attempt's secret proved to each gate), and greedy
// output is the same as the model on one machine. The gate admits only the leader's address, and
// from it only who proves the attempt's secret, before a byte reaches the rpc-server; Stop leaves
// nothing running.

#include "executor/gang_member.h"
#include "executor/gang_link.h"
#include "executor/gang_handshake.h"
#include "executor/gang_tunnel.h"
#include "executor/runner_sandbox.h"
#include "sandbox/own_network.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/host_port.h"
#include "runner/batch_record.h"
#include "runner/runner_process.h"
#include "llama_runner_process.h"
#include "test_env.h"
#include "testing/read_file.h"

namespace minions {
namespace {

using ::testing::HasSubstr;
using minions::testing::ReadFile;
using minions::testing::RunRecords;
using minions::testing::TestProgram;

constexpr char kSecret[] = "4f1c0d7e9a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5";

GangMemberOptions MemberOptions(const std::string& leader = "127.0.0.1") {
  GangMemberOptions options;
  options.secret = kSecret;
  options.rpc_server = TestProgram("ggml-rpc-server");
  options.bind_host = "127.0.0.1";
  options.leader_host = leader;
  options.threads = 1;
  return options;
}

// A member whose rpc-server runs as an executor runs it: under minions-sandbox (RunnerSandbox::
// WrapRpcServer: an empty environment, no files, TCP only to listen on its loopback port).
GangMemberOptions SandboxedMemberOptions() {
  GangMemberOptions options = MemberOptions();
  RunnerSandboxOptions sandbox;
  sandbox.launcher = TestProgram("minions-sandbox");
  sandbox.scratch_dir = (std::filesystem::temp_directory_path() / ("gang-sandbox-" + std::to_string(getpid()))).string();
  auto made = RunnerSandbox::Create(sandbox);
  EXPECT_TRUE(made.ok()) << made.status();
  if (made.ok()) {
    options.wrap = [s = *made](const std::vector<std::string>& argv, int port, const std::string& bridge) {
      return s->WrapRpcServer(argv, port, bridge);
    };
  }
  return options;
}

// The leader's side as its executor builds it: a tunnel per member that carries only `runner`'s
// connections and proves the secret; `load` is pointed at the tunnels.
std::vector<std::unique_ptr<GangTunnel>> Tunnels(RunnerProcess& runner, runner_protocol::LoadRequest& load,
                                                 const std::string& secret = kSecret) {
  std::vector<std::unique_ptr<GangTunnel>> tunnels;
  for (auto& server : load.gang.servers) {
    auto tunnel = GangTunnel::Start({server.endpoint, secret});
    EXPECT_TRUE(tunnel.ok()) << tunnel.status();
    if (!tunnel.ok()) continue;
    (*tunnel)->AdmitProcess(runner.pid());
    server.endpoint = (*tunnel)->endpoint();
    tunnels.push_back(*std::move(tunnel));
  }
  return tunnels;
}

std::unique_ptr<RunnerProcess> StartRunner() { return testing::StartLlamaRunner(); }

runner_protocol::LoadRequest SmallLoad() {
  runner_protocol::LoadRequest load{testing::TestModel("text.gguf"), {}};
  load.options.n_parallel = 4;
  load.options.n_ctx_per_seq = 128;
  load.options.n_threads = 1;
  load.options.flash_attn = "off";
  return load;
}

// Connects from `source` (a loopback address) to `endpoint`; returns the socket or -1.
int ConnectFrom(const std::string& source, const std::string& endpoint) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(endpoint, &host, &port).ok()) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &remote.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(Gang, GreedyOutputOfAGangOfTwoEqualsTheModelOnOneMachine) {
  // Both members' rpc-servers sandboxed, as an executor runs them.
  auto first = GangMember::Start(SandboxedMemberOptions());
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = GangMember::Start(SandboxedMemberOptions());
  ASSERT_TRUE(second.ok()) << second.status();

  std::vector<std::string> records;
  for (int i = 0; i < 6; ++i) {
    records.push_back(DumpJson({{"custom_id", "r" + std::to_string(i)},
                                {"prompt", "Once upon a time number " + std::to_string(i)},
                                {"max_tokens", 12},
                                {"temperature", 0}}));
  }
  records.push_back(R"({"custom_id":"chat","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Say something"}],"max_tokens":10,"temperature":0}})");

  auto alone = StartRunner();
  ASSERT_TRUE(alone);
  ASSERT_TRUE(alone->Load(SmallLoad()).ok());
  auto expected = RunRecords(*alone, "b", records);

  auto leader = StartRunner();
  ASSERT_TRUE(leader);
  auto load = SmallLoad();
  // Equal shares: the leader keeps the first layers on its CPU, each member gets some of the rest.
  load.gang.leader_bytes = 1 << 30;
  load.gang.servers = {{(*first)->endpoint(), 1 << 30}, {(*second)->endpoint(), 1 << 30}};
  auto tunnels = Tunnels(*leader, load);
  auto info = leader->Load(load);
  ASSERT_TRUE(info.ok()) << info.status();
  const Json& gang = (*info)["gang"];
  ASSERT_TRUE(gang.is_object()) << DumpJson(*info);
  EXPECT_EQ(gang["servers"].size(), 2u);
  EXPECT_GT(gang["leader_cpu_layers"].get<int>(), 0);
  EXPECT_GT(gang["offloaded_layers"].get<int>(), 1);  // at least one layer for each member
  // Both members were reached through their gates.
  EXPECT_GE((*first)->admitted(), 1);
  EXPECT_GE((*second)->admitted(), 1);

  auto got = RunRecords(*leader, "b", records);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < records.size(); ++i) {
    ASSERT_FALSE(minions::IsErrorOutputLine(expected[i])) << DumpJson(expected[i]);
    ASSERT_FALSE(minions::IsErrorOutputLine(got[i])) << DumpJson(got[i]);
    EXPECT_EQ(got[i]["response"]["body"]["choices"], expected[i]["response"]["body"]["choices"]) << records[i];
    EXPECT_EQ(got[i]["response"]["body"]["usage"], expected[i]["response"]["body"]["usage"]);
  }
  EXPECT_EQ(leader->Shutdown().code, 0);
  EXPECT_EQ(alone->Shutdown().code, 0);
}

TEST(Gang, AnUnreachableMemberIsALoadErrorAndTheRunnerLivesOn) {
  // A port that was free a moment ago and has no listener.
  auto member = GangMember::Start(MemberOptions());
  ASSERT_TRUE(member.ok()) << member.status();
  const std::string endpoint = (*member)->endpoint();
  (*member)->Stop();

  auto runner = StartRunner();
  ASSERT_TRUE(runner);
  auto load = SmallLoad();
  load.gang.servers = {{endpoint, 1 << 30}};
  auto info = runner->Load(load);
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("unreachable"));
  // Still serving: the same model loads alone.
  EXPECT_TRUE(runner->Load(SmallLoad()).ok());
  EXPECT_EQ(runner->Shutdown().code, 0);
}

TEST(Gang, AMemberThatDiesTakesTheLeadersRunnerDownAndTheExecutorSeesACrash) {
  auto member = GangMember::Start(MemberOptions());
  ASSERT_TRUE(member.ok()) << member.status();
  auto leader = StartRunner();
  ASSERT_TRUE(leader);
  auto load = SmallLoad();
  load.gang.servers = {{(*member)->endpoint(), 1 << 30}};
  auto tunnels = Tunnels(*leader, load);
  ASSERT_TRUE(leader->Load(load).ok());
  ASSERT_FALSE(RunRecords(*leader, "b", {R"({"custom_id":"a","prompt":"Hello","max_tokens":4})"})[0].is_null());
  (*member)->Stop();  // the member's rpc-server is SIGKILLed
  std::vector<Json> outputs(1);
  auto done = leader->RunBatch("after", {R"({"custom_id":"b","prompt":"Hello","max_tokens":4})"},
                               [&](size_t i, const Json& line) { outputs[i] = line; });
  EXPECT_FALSE(done.ok());  // the runner is gone: a runner crash, which the executor handles
  EXPECT_TRUE(outputs[0].is_null());
}

TEST(GangMember, TheGateClosesConnectionsFromAnyoneButTheLeader) {
  // The leader is 127.0.0.2; a connection from 127.0.0.1 is closed before a byte is forwarded,
  // even with the secret (a non-member that learnt it cannot use it from elsewhere).
  auto member = GangMember::Start(MemberOptions("127.0.0.2"));
  ASSERT_TRUE(member.ok()) << member.status();
  int intruder = ConnectFrom("127.0.0.1", (*member)->endpoint());
  ASSERT_GE(intruder, 0);
  EXPECT_FALSE(ProveLeader(intruder, kSecret, absl::Seconds(10)).ok());  // closed by the gate
  close(intruder);
  EXPECT_EQ((*member)->refused(), 1);
  EXPECT_EQ((*member)->admitted(), 0);
  EXPECT_EQ((*member)->bytes_in(), 0);
}

// The attacks on the gate from the leader's own address (a process on the leader's machine, or
// a host that took the leader's address): each refused before one byte reaches the rpc-server.
class GateAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    auto member = GangMember::Start(MemberOptions());
    ASSERT_TRUE(member.ok()) << member.status();
    member_ = *std::move(member);
  }
  // Connects from the leader's address; the gate's answer to `attack` on that connection.
  void Attack(const std::function<void(int)>& attack) {
    int fd = ConnectFrom("127.0.0.1", member_->endpoint());
    ASSERT_GE(fd, 0);
    attack(fd);
    char byte;
    while (read(fd, &byte, 1) > 0) {
    }  // until the gate closes it
    close(fd);
    for (int i = 0; i < 1000 && member_->refused() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  void ExpectRefusedUnforwarded() {
    EXPECT_EQ(member_->refused(), 1);
    EXPECT_EQ(member_->admitted(), 0);
    EXPECT_EQ(member_->bytes_in(), 0) << "a byte reached the rpc-server";
    EXPECT_TRUE(member_->running()) << "the rpc-server lives on for the real leader";
  }
  std::unique_ptr<GangMember> member_;
};

TEST_F(GateAttack, ARawRpcClientWithNoSecretIsRefused) {
  Attack([](int fd) {
    // llama.cpp's client opens with RPC_CMD_HELLO (14) and a size: what a local process would send.
    std::string hello(1 + 8, '\0');
    hello[0] = 14;
    send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
  });
  ExpectRefusedUnforwarded();
}

TEST_F(GateAttack, AWrongSecretIsRefused) {
  Attack([](int fd) { EXPECT_EQ(ProveLeader(fd, "not-the-secret", absl::Seconds(10)).code(),
                                absl::StatusCode::kPermissionDenied); });
  ExpectRefusedUnforwarded();
}

TEST_F(GateAttack, AStaleAttemptsSecretIsRefused) {
  // The previous attempt's leader: its secret was that attempt's, not this one's.
  Attack([](int fd) {
    EXPECT_EQ(ProveLeader(fd, "0000000000000000000000000000000000000000000000000000000000000001", absl::Seconds(10))
                  .code(),
              absl::StatusCode::kPermissionDenied);
  });
  ExpectRefusedUnforwarded();
}

TEST_F(GateAttack, TheAttemptsLeaderIsForwarded) {
  int fd = ConnectFrom("127.0.0.1", member_->endpoint());
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(ProveLeader(fd, kSecret, absl::Seconds(10)).ok());
  close(fd);
  for (int i = 0; i < 1000 && member_->admitted() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(member_->admitted(), 1);
  EXPECT_EQ(member_->refused(), 0);
}

// docs/security.md 40.1d: the rpc-server is no plain child of the executor: none of the
// executor's environment (a planted credential), no_new_privs and seccomp (and Landlock where the
// kernel has it: no files but the system's and its own folder, TCP only on its loopback port).
TEST(GangMember, ItsRpcServerRunsSandboxedWithoutTheExecutorsEnvironment) {
  setenv("AWS_SECRET_ACCESS_KEY", "planted-by-the-test", 1);
  auto member = GangMember::Start(SandboxedMemberOptions());
  unsetenv("AWS_SECRET_ACCESS_KEY");
  ASSERT_TRUE(member.ok()) << member.status();
  const std::string proc = "/proc/" + std::to_string((*member)->rpc_server_pid());
  EXPECT_THAT(ReadFile(proc + "/cmdline"), HasSubstr("ggml-rpc-server"));
  EXPECT_THAT(ReadFile(proc + "/environ"), ::testing::Not(HasSubstr("planted-by-the-test")));
  const std::string status = ReadFile(proc + "/status");
  EXPECT_THAT(status, HasSubstr("NoNewPrivs:\t1"));
  EXPECT_THAT(status, HasSubstr("Seccomp:\t2"));
  // And it serves the attempt's leader.
  int fd = ConnectFrom("127.0.0.1", (*member)->endpoint());
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(ProveLeader(fd, kSecret, absl::Seconds(10)).ok());
  close(fd);
}

// A local process racing for the rpc-server's port (docs/security.md 40.1e): the rpc-server
// listens in a network namespace of its own, so its loopback port is nobody's on this machine's
// loopback; the gate reaches it through the bridge, whose socket is in a folder only this user
// enters, and the folder is gone once the member stops.
TEST(GangMember, ItsRpcServersPortIsReachableByNoLocalProcessButThroughTheGate) {
  auto member = GangMember::Start(SandboxedMemberOptions());
  ASSERT_TRUE(member.ok()) << member.status();
  if (!(*member)->own_network() && geteuid() != 0) {
    GTEST_SKIP() << "this kernel refuses this user a network namespace (unprivileged user namespaces off): the "
                    "rpc-server listens on the machine's loopback, with a warning";
  }
  ASSERT_TRUE((*member)->own_network()) << "root got the rpc-server no network namespace";
  EXPECT_LT(ConnectFrom("127.0.0.1", absl::StrCat("127.0.0.1:", (*member)->rpc_server_port())), 0)
      << "the rpc-server's port answers on this machine's loopback";
  const std::string bridge = (*member)->bridge_path();
  const std::string folder = std::filesystem::path(bridge).parent_path().string();
  struct stat info {};
  ASSERT_EQ(stat(folder.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  // Another user's process cannot even reach the bridge (tests run as root: a child as nobody).
  if (geteuid() == 0) {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(2);
      _exit(sandbox::ConnectThroughBridge(bridge, absl::Seconds(5)).ok() ? 1 : 0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "another user reached the rpc-server's bridge";
  }
  // The leader still passes the gate (Gang.GreedyOutputOfAGangOfTwoEqualsTheModelOnOneMachine runs
  // a model through it, the rpc-servers in networks of their own).
  int fd = ConnectFrom("127.0.0.1", (*member)->endpoint());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(ProveLeader(fd, kSecret, absl::Seconds(10)).ok());
  close(fd);
  (*member)->Stop();
  EXPECT_FALSE(std::filesystem::exists(folder)) << "the bridge's folder outlived the member";
}

TEST(GangMember, ADutyWithoutASecretServesNothing) {
  auto options = MemberOptions();
  options.secret.clear();
  EXPECT_EQ(GangMember::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GangMember, StopKillsTheRpcServerAndClosesTheGate) {
  auto member = GangMember::Start(MemberOptions());
  ASSERT_TRUE(member.ok()) << member.status();
  const std::string endpoint = (*member)->endpoint();
  EXPECT_TRUE((*member)->running());
  (*member)->Stop();
  EXPECT_FALSE((*member)->running());
  EXPECT_LT(ConnectFrom("127.0.0.1", endpoint), 0);
}

// A member whose rpc-server dies while its executor lives: the gate stops answering, so the
// leader's check after its runner died finds the member gone (the attempt is preempted and runs on
// a new gang) instead of a runner that crashed on its own (which would blame its records).
TEST(GangMember, ItsRpcServerDyingClosesTheGateSoTheLeaderFindsTheMemberGone) {
  auto member = GangMember::Start(MemberOptions());
  ASSERT_TRUE(member.ok()) << member.status();
  NetworkGangLink link;
  const std::string endpoint = (*member)->endpoint();
  EXPECT_TRUE(link.Answers(endpoint, kSecret));
  EXPECT_FALSE(link.Answers(endpoint, "another attempt's secret"));  // the leader's check is the handshake
  ASSERT_EQ(kill((*member)->rpc_server_pid(), SIGKILL), 0);
  for (int i = 0; i < 1000 && (*member)->running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_FALSE((*member)->running());
  // Whether the gate has closed yet or still closes what it cannot forward, it does not answer.
  EXPECT_FALSE(link.Answers(endpoint, kSecret));
  // And the gate closes: a connection to it is refused.
  int fd = ConnectFrom("127.0.0.1", endpoint);
  for (int i = 0; i < 1000 && fd >= 0; ++i) {
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    fd = ConnectFrom("127.0.0.1", endpoint);
  }
  EXPECT_LT(fd, 0);
  (*member)->Stop();  // still idempotent after the gate closed itself
}

TEST(GangMember, RefusesToListenOnEveryInterfaceOrAName) {
  for (const std::string host : {"0.0.0.0", "::", "", "gang.example"}) {
    auto options = MemberOptions();
    options.bind_host = host;
    auto member = GangMember::Start(options);
    EXPECT_EQ(member.status().code(), absl::StatusCode::kInvalidArgument) << host;
  }
  auto options = MemberOptions("not-an-address");
  EXPECT_EQ(GangMember::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GangMember, SameIpAddressReadsBothWritings) {
  EXPECT_TRUE(SameIpAddress("10.0.0.1", "::ffff:10.0.0.1"));
  EXPECT_TRUE(SameIpAddress("fe80::1", "fe80:0::1"));
  EXPECT_FALSE(SameIpAddress("10.0.0.1", "10.0.0.2"));
  EXPECT_FALSE(SameIpAddress("host", "host"));
}

}  // namespace
}  // namespace minions
