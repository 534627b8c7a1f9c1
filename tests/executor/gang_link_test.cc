// The gang link's two ends without llama.cpp (docs/security.md, findings 40.1a-40.1d): the
// handshake a member's gate asks of its leader (executor/gang_handshake.h), and the leader's
// tunnel that forwards only its runner's connections (executor/gang_tunnel.h). Each refusal has a
// test: no secret, a wrong secret, a stale attempt's secret, an impostor member, another local
// process. Real sockets (socket pairs and loopback), no rpc-server (tests/llama/gang_test.cc
// runs the real one behind its gate).

#include "executor/gang_handshake.h"
#include "executor/gang_tunnel.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace minions {
namespace {

using ::testing::HasSubstr;

constexpr char kSecret[] = "attempt-2-secret-0123456789abcdef0123456789abcdef0123456789abcdef";
constexpr char kStaleSecret[] = "attempt-1-secret-fedcba9876543210fedcba9876543210fedcba9876543210";
const absl::Duration kTimeout = absl::Seconds(10);

struct Pair {
  int gate = -1;
  int leader = -1;
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    gate = fds[0];
    leader = fds[1];
  }
  ~Pair() {
    close(gate);
    close(leader);
  }
};

// The gate's verdict on a leader that runs `leader` on its end.
absl::Status GateVerdict(const std::string& gate_secret, const std::function<void(int)>& leader) {
  Pair pair;
  absl::Status verdict;
  std::thread gate([&] {
    verdict = AdmitLeader(pair.gate, gate_secret, kTimeout);
    shutdown(pair.gate, SHUT_RDWR);  // as the gate does with a refused peer
  });
  leader(pair.leader);
  gate.join();
  return verdict;
}

TEST(GangHandshake, TheAttemptsLeaderIsAdmittedAndBothEndsProveTheSecret) {
  absl::Status leader_side;
  absl::Status verdict = GateVerdict(kSecret, [&](int fd) { leader_side = ProveLeader(fd, kSecret, kTimeout); });
  EXPECT_TRUE(verdict.ok()) << verdict;
  EXPECT_TRUE(leader_side.ok()) << leader_side;
}

TEST(GangHandshake, APeerWithNoSecretIsRefused) {
  // A raw llama.cpp RPC client: it sends its command (RPC_CMD_HELLO, 14, and a size) and waits.
  absl::Status verdict = GateVerdict(kSecret, [](int fd) {
    std::string hello(1 + 8, '\0');
    hello[0] = 14;
    ASSERT_EQ(send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello.size()));
    shutdown(fd, SHUT_WR);  // says no more: the gate must decide on what it has
    char sink[256];
    while (read(fd, sink, sizeof(sink)) > 0) {
    }
  });
  EXPECT_EQ(verdict.code(), absl::StatusCode::kPermissionDenied) << verdict;
  // And one that speaks the handshake's framing but has no secret to key it with.
  absl::Status leader_side;
  verdict = GateVerdict(kSecret, [&](int fd) {
    leader_side = ProveLeader(fd, "", kTimeout);
    shutdown(fd, SHUT_RDWR);  // it gives up: the gate hears the end, not a timeout
  });
  EXPECT_FALSE(verdict.ok());
  EXPECT_EQ(leader_side.code(), absl::StatusCode::kPermissionDenied);
}

TEST(GangHandshake, AWrongSecretIsRefused) {
  absl::Status leader_side;
  absl::Status verdict =
      GateVerdict(kSecret, [&](int fd) { leader_side = ProveLeader(fd, "guessed-secret", kTimeout); });
  EXPECT_EQ(verdict.code(), absl::StatusCode::kPermissionDenied) << verdict;
  EXPECT_THAT(std::string(verdict.message()), HasSubstr("secret"));
  EXPECT_EQ(leader_side.code(), absl::StatusCode::kPermissionDenied);
}

// The previous attempt's leader (its gang ended, the task runs again on a new gang with a new
// secret) cannot reach the new attempt's members.
TEST(GangHandshake, AStaleAttemptsSecretIsRefused) {
  absl::Status leader_side;
  absl::Status verdict = GateVerdict(kSecret, [&](int fd) { leader_side = ProveLeader(fd, kStaleSecret, kTimeout); });
  EXPECT_EQ(verdict.code(), absl::StatusCode::kPermissionDenied) << verdict;
  EXPECT_EQ(leader_side.code(), absl::StatusCode::kPermissionDenied);
}

TEST(GangHandshake, AGateWithoutASecretAdmitsNobody) {
  absl::Status leader_side;
  absl::Status verdict = GateVerdict("", [&](int fd) {
    leader_side = ProveLeader(fd, "", kTimeout);
    shutdown(fd, SHUT_RDWR);
  });
  EXPECT_EQ(verdict.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(leader_side.ok());
}

// Replaying what the real leader sent on another connection is worth nothing: each gate's
// challenge is fresh.
TEST(GangHandshake, ARecordedAnswerIsRefusedOnTheNextConnection) {
  std::string recorded;
  {
    Pair pair;
    absl::Status leader_side;
    std::thread leader([&] { leader_side = ProveLeader(pair.leader, kSecret, kTimeout); });
    // The wiretap: the gate's end reads the answer and sends the challenge of a real gate would.
    std::string challenge = "MGANG/1\n" + std::string(32, 'n');
    ASSERT_EQ(send(pair.gate, challenge.data(), challenge.size(), MSG_NOSIGNAL), 40);
    recorded.resize(72);
    size_t got = 0;
    while (got < recorded.size()) {
      ssize_t n = read(pair.gate, recorded.data() + got, recorded.size() - got);
      ASSERT_GT(n, 0);
      got += static_cast<size_t>(n);
    }
    shutdown(pair.gate, SHUT_RDWR);
    leader.join();
  }
  absl::Status verdict = GateVerdict(kSecret, [&](int fd) {
    char challenge[40];
    ASSERT_EQ(read(fd, challenge, sizeof(challenge)), 40);
    ASSERT_EQ(send(fd, recorded.data(), recorded.size(), MSG_NOSIGNAL), 72);
  });
  EXPECT_EQ(verdict.code(), absl::StatusCode::kPermissionDenied) << verdict;
}

// The leader checks the member too: an impostor at a member's address (it answers the challenge's
// framing but holds no secret) gets no RPC traffic.
TEST(GangHandshake, TheLeaderRefusesAnImpostorMember) {
  Pair pair;
  std::thread impostor([&] {
    std::string challenge = "MGANG/1\n" + std::string(32, 'x');
    ASSERT_EQ(send(pair.gate, challenge.data(), challenge.size(), MSG_NOSIGNAL), 40);
    char answer[72];
    size_t got = 0;
    while (got < sizeof(answer)) {
      ssize_t n = read(pair.gate, answer + got, sizeof(answer) - got);
      if (n <= 0) return;
      got += static_cast<size_t>(n);
    }
    std::string proof(32, 'p');
    send(pair.gate, proof.data(), proof.size(), MSG_NOSIGNAL);
  });
  absl::Status leader_side = ProveLeader(pair.leader, kSecret, kTimeout);
  impostor.join();
  EXPECT_EQ(leader_side.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(leader_side.message()), HasSubstr("impostor"));
}

// A member's gate on loopback, for the tunnel: admits the secret's holder, then echoes.
class FakeGate {
 public:
  explicit FakeGate(std::string secret) : secret_(std::move(secret)) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(address);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), len), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &len);
    endpoint_ = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
    thread_ = std::thread([this] {
      int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return;
      verdict_ = AdmitLeader(client, secret_, kTimeout);
      char buffer[64];
      ssize_t n;
      while (verdict_.ok() && (n = read(client, buffer, sizeof(buffer))) > 0) send(client, buffer, n, MSG_NOSIGNAL);
      close(client);
    });
  }
  ~FakeGate() {
    shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    close(fd_);
  }
  const std::string& endpoint() const { return endpoint_; }
  // After the one connection ended.
  absl::Status verdict() {
    shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    return verdict_;
  }

 private:
  std::string secret_;
  int fd_ = -1;
  std::string endpoint_;
  std::thread thread_;
  absl::Status verdict_ = absl::UnknownError("no connection");
};

int ConnectTo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << std::strerror(errno);
  return fd;
}

// A process that does nothing until killed (EndProcess): the tunnels' runner, when this test's
// process must not be it.
pid_t IdleProcess() {
  pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

void EndProcess(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// A tunnel to a FakeGate whose runner is another process (IdleProcess, ended with this): a
// connection from this test's process is never the runner's.
struct TunnelForAnotherProcess {
  TunnelForAnotherProcess() : tunnel(GangTunnel::Start({gate.endpoint(), kSecret})) {
    if (!tunnel.ok()) return;
    runner = IdleProcess();
    if (runner > 0) (*tunnel)->AdmitProcess(runner);
  }
  ~TunnelForAnotherProcess() {
    if (runner > 0) EndProcess(runner);
  }
  bool started() const { return tunnel.ok() && runner > 0; }
  // After the test's connections: the tunnel refused `refused`, admitted none, and stops; the
  // member was never reached.
  void ExpectOnlyRefused(int refused) {
    EXPECT_EQ((*tunnel)->refused(), refused);
    EXPECT_EQ((*tunnel)->admitted(), 0);
    (*tunnel)->Stop();
    EXPECT_EQ(gate.verdict().code(), absl::StatusCode::kUnknown) << "the member was never reached";
  }
  FakeGate gate{kSecret};
  absl::StatusOr<std::unique_ptr<GangTunnel>> tunnel;
  pid_t runner = -1;
};

// Sends "ping" on `fd` (a connection to a tunnel) and expects it closed unanswered; closes it.
void ExpectClosedUnanswered(int fd) {
  send(fd, "ping", 4, MSG_NOSIGNAL);
  char byte;
  EXPECT_LE(read(fd, &byte, 1), 0);  // closed by the tunnel
  close(fd);
}

TEST(GangTunnel, CarriesTheRunnersConnectionToTheMemberAfterTheHandshake) {
  FakeGate gate(kSecret);
  auto tunnel = GangTunnel::Start({gate.endpoint(), kSecret});
  ASSERT_TRUE(tunnel.ok()) << tunnel.status();
  (*tunnel)->AdmitProcess(getpid());  // this test's process plays the runner
  int fd = ConnectTo((*tunnel)->port());
  ASSERT_EQ(send(fd, "ping", 4, MSG_NOSIGNAL), 4);
  char echo[4] = {};
  ASSERT_EQ(read(fd, echo, 4), 4);
  EXPECT_EQ(std::string(echo, 4), "ping");
  close(fd);
  EXPECT_TRUE(gate.verdict().ok());
  (*tunnel)->Stop();
  EXPECT_EQ((*tunnel)->admitted(), 1);
  EXPECT_EQ((*tunnel)->refused(), 0);
}

// Another process on the leader's machine racing for the tunnel's port: closed unread, and the
// member never hears of it.
TEST(GangTunnel, AnotherLocalProcessIsRefused) {
  TunnelForAnotherProcess t;
  ASSERT_TRUE(t.started()) << t.tunnel.status();
  GangTunnel& tunnel = **t.tunnel;
  ExpectClosedUnanswered(ConnectTo(tunnel.port()));  // this process is not the runner
  t.ExpectOnlyRefused(1);
}

// The runner checks that each tunnel answers before llama.cpp connects (it connects and hangs up:
// llama.cpp's RPC client aborts on an unreachable server). Its socket is gone before the tunnel
// can look it up, so the probe cannot be told from another process's connection: one that hung
// up having sent nothing is closed quietly, neither refused (it was logged as a refusal once per
// member before every load) nor forwarded; one that speaks is refused as before.
TEST(GangTunnel, AConnectionThatHangsUpUnheardIsNotARefusal) {
  TunnelForAnotherProcess t;
  ASSERT_TRUE(t.started()) << t.tunnel.status();
  GangTunnel& tunnel = **t.tunnel;
  close(ConnectTo(tunnel.port()));  // a probe: connects and hangs up
  ExpectClosedUnanswered(ConnectTo(tunnel.port()));  // and one that speaks
  for (int i = 0; i < 1000 && tunnel.refused() + tunnel.hung_up() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(tunnel.hung_up(), 1);
  t.ExpectOnlyRefused(1);
}

// A connection that is not the runner's and stays silent is refused too, within
// kSuspectWait, and holds up no other connection meanwhile.
TEST(GangTunnel, ASilentConnectionThatIsNotTheRunnersIsRefusedAtItsDeadline) {
  TunnelForAnotherProcess t;
  ASSERT_TRUE(t.started()) << t.tunnel.status();
  GangTunnel& tunnel = **t.tunnel;
  int silent = ConnectTo(tunnel.port());
  int other = ConnectTo(tunnel.port());  // judged while the first one waits
  ExpectClosedUnanswered(other);
  char byte;
  EXPECT_LE(read(silent, &byte, 1), 0);  // closed at its deadline
  close(silent);
  EXPECT_EQ(tunnel.hung_up(), 0);
  t.ExpectOnlyRefused(2);
}

TEST(GangTunnel, BeforeTheRunnerIsKnownNobodyIsCarried) {
  FakeGate gate(kSecret);
  auto tunnel = GangTunnel::Start({gate.endpoint(), kSecret});
  ASSERT_TRUE(tunnel.ok()) << tunnel.status();
  int fd = ConnectTo((*tunnel)->port());
  char byte;
  EXPECT_LE(read(fd, &byte, 1), 0);
  close(fd);
  EXPECT_EQ((*tunnel)->refused(), 1);
}

TEST(GangTunnel, AMemberThatDoesNotProveTheSecretGetsNothing) {
  FakeGate gate(kStaleSecret);  // a gate of another attempt (or an impostor)
  auto tunnel = GangTunnel::Start({gate.endpoint(), kSecret});
  ASSERT_TRUE(tunnel.ok()) << tunnel.status();
  (*tunnel)->AdmitProcess(getpid());
  ExpectClosedUnanswered(ConnectTo((*tunnel)->port()));
  EXPECT_EQ(gate.verdict().code(), absl::StatusCode::kPermissionDenied);
  (*tunnel)->Stop();
  EXPECT_EQ((*tunnel)->refused(), 1);
  EXPECT_EQ((*tunnel)->admitted(), 0);
}

TEST(GangTunnel, ALeaseWithoutASecretOpensNoTunnel) {
  EXPECT_EQ(GangTunnel::Start({"127.0.0.1:9", ""}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace minions
