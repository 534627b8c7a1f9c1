// What an executor trusts, piece by piece: the URL policy, the model folders, the runner's
// sandbox (its launcher run on real programs).

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/host_port.h"
#include "common/subprocess.h"
#include "executor/model_access.h"
#include "executor/owner_controls.h"
#include "executor/runner_sandbox.h"
#include "executor/url_policy.h"
#include "sandbox/sandbox.h"
#include "testing/run_program.h"

namespace minions {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class TrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("minions-trust-" + std::to_string(getpid()))).string();
    fs::remove_all(dir_);
    for (const char* sub : {"objects/jobs", "models/sub", "outside", "scratch"}) fs::create_directories(dir_ + "/" + sub);
    std::ofstream(dir_ + "/outside/secret") << "secret";
    std::ofstream(dir_ + "/models/m.gguf") << "GGUF";
    std::ofstream(dir_ + "/models/sub/n.gguf") << "GGUF";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

// ------------------------------------------------------------------ URL policy

TEST_F(TrustTest, AnOriginIsSchemeHostAndPortExactly) {
  auto policy = UrlPolicy::Create({{"https://S3.corp.example:9000", "http://127.0.0.1:4569"}, false});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_TRUE(policy->Check("https://s3.corp.example:9000/bucket/key?X-Amz-Signature=abc", false).ok());
  EXPECT_TRUE(policy->Check("http://127.0.0.1:4569/b/k", true).ok());
  for (const char* refused :
       {"https://s3.corp.example/bucket/key",        // default port 443, not 9000
        "http://s3.corp.example:9000/bucket/key",     // not https
        "https://s3.corp.example.evil:9000/k",        // another host
        "https://evil@s3.corp.example:9000/k",        // user information
        "https://s3.corp.example:9000@evil.example/k",
        "https://s3.corp.example:9000/k#frag",
        "https://s3.corp.example:9000/k with space",
        "file:///etc/passwd",                          // no folder configured
        "gopher://s3.corp.example:9000/",
        "",
        "https://s3.corp.example:9000/\x01",
        "https://[::1]:9000/k"}) {
    absl::Status s = policy->Check(refused, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << refused;
  }
  // Messages never show a presigned query.
  EXPECT_THAT(std::string(policy->Check("https://evil.example/k?X-Amz-Signature=abc", false).message()),
              Not(HasSubstr("abc")));
}

TEST_F(TrustTest, PlainHttpAndFoldersAreOnlyForThisMachine) {
  EXPECT_FALSE(UrlPolicy::Create({{"http://s3.corp.example:9000"}, false}).ok());
  EXPECT_FALSE(UrlPolicy::Create({{"https://s3.corp.example:9000/bucket"}, false}).ok());  // an origin, no path
  EXPECT_FALSE(UrlPolicy::Create({{"file://" + dir_ + "/objects"}, /*loopback_server=*/false}).ok());
  EXPECT_FALSE(UrlPolicy::Create({{"relative/folder"}, true}).ok());
  EXPECT_TRUE(UrlPolicy::Create({{"http://localhost:9000", "http://[::1]:9000"}, false}).ok());
  // A name that merely starts like a loopback address is a name DNS may point anywhere (issue 40,
  // point 7): plain http to it is refused, as every other loopback check refuses it.
  EXPECT_FALSE(UrlPolicy::Create({{"http://127.evil.example:9000"}, false}).ok());
  EXPECT_FALSE(UrlPolicy::Create({{"http://127.0.0.1.evil.example:9000"}, false}).ok());
  EXPECT_TRUE(UrlPolicy::Create({{"http://127.0.0.2:9000"}, false}).ok());
}

TEST(LoopbackCheck, OnlyLoopbackLiteralsAndLocalhostPass) {
  for (const char* yes : {"127.0.0.1", "127.1.2.3", "localhost", "LocalHost", "::1", "[::1]", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(yes)) << yes;
  }
  for (const char* no : {"127.evil.example", "127.0.0.1.evil.example", "localhost.evil.example", "0.0.0.0", "::", "",
                         "10.0.0.1", "::ffff:10.0.0.1", "evil.example"}) {
    EXPECT_FALSE(IsLoopbackHost(no)) << no;
  }
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:7070"));
  EXPECT_TRUE(IsLoopbackAddress("dns:///localhost:7070"));
  EXPECT_FALSE(IsLoopbackAddress("127.evil.example:7070"));
  EXPECT_FALSE(IsLoopbackAddress("dns:///127.evil.example:7070"));
}

TEST_F(TrustTest, FileUrlsStayInsideTheirFolder) {
  auto policy = UrlPolicy::Create({{"file://" + dir_ + "/objects"}, true});
  ASSERT_TRUE(policy.ok()) << policy.status();
  const std::string objects = dir_ + "/objects";
  EXPECT_TRUE(policy->Check("file://" + objects + "/jobs/a/input.jsonl", false).ok());
  EXPECT_TRUE(policy->Check("file://" + objects + "/jobs/new/folders/out.jsonl", true).ok());  // not made yet
  fs::create_directory_symlink(dir_ + "/outside", objects + "/jobs/link");
  fs::create_symlink(dir_ + "/outside/secret", objects + "/jobs/file-link");
  fs::create_symlink(dir_ + "/outside/missing", objects + "/jobs/dangling");
  for (const std::string& refused :
       {"file://" + dir_ + "/outside/secret", "file://" + objects + "/../outside/secret",
        "file://" + objects + "/jobs/./a", "file://" + objects + "//jobs/a", "file://" + objects,
        "file://" + objects + "/jobs/link/secret", "file://" + objects + "/jobs/link/new",
        "file://" + objects + "/jobs/file-link", "file://" + objects + "/jobs/dangling",
        "file://" + objects + "/jobs/a?b", "file:" + objects + "/jobs/a", "file://host" + objects + "/jobs/a",
        std::string("file://") + objects + "/jobs/a\\..\\b"}) {
    EXPECT_EQ(policy->Check(refused, true).code(), absl::StatusCode::kPermissionDenied) << refused;
    EXPECT_EQ(policy->Check(refused, false).code(), absl::StatusCode::kPermissionDenied) << refused;
  }
  // A folder that is itself a link is followed once, when the policy is made.
  fs::create_directory_symlink(objects, dir_ + "/objects-link");
  auto via_link = UrlPolicy::Create({{dir_ + "/objects-link"}, true});
  ASSERT_TRUE(via_link.ok());
  EXPECT_TRUE(via_link->Check("file://" + objects + "/jobs/x", true).ok());
}

// What the blob client is never asked: a refused URL makes no request at all.
TEST_F(TrustTest, APolicyClientRefusesBeforeItsInnerClientIsCalled) {
  struct Counting : BlobClient {
    int calls = 0;
    absl::StatusOr<std::string> GetRange(const std::string&, int64_t, int64_t) override {
      ++calls;
      return std::string("x");
    }
    absl::Status Put(const std::string&, std::string_view) override {
      ++calls;
      return absl::OkStatus();
    }
  };
  auto inner = std::make_unique<Counting>();
  Counting* counting = inner.get();
  auto policy = UrlPolicy::Create({{"file://" + dir_ + "/objects"}, true});
  ASSERT_TRUE(policy.ok());
  PolicyBlobClient client(*policy, std::move(inner));
  EXPECT_FALSE(client.Put("file://" + dir_ + "/outside/secret", "pwned").ok());
  EXPECT_FALSE(client.GetRange("https://evil.example/x", 0, 1).ok());
  EXPECT_EQ(counting->calls, 0);
  EXPECT_TRUE(client.Put("file://" + dir_ + "/objects/jobs/out", "ok").ok());
  EXPECT_EQ(counting->calls, 1);
}

// ------------------------------------------------------------------ model folders

TEST_F(TrustTest, ModelsLoadOnlyFromTheFoldersAndEveryRefusalIsTheSame) {
  auto access = ModelAccess::Create({{dir_ + "/models"}, ""});
  ASSERT_TRUE(access.ok());
  const std::string models = fs::canonical(dir_ + "/models").string();
  EXPECT_EQ(*access->Resolve(dir_ + "/models/m.gguf"), models + "/m.gguf");
  EXPECT_EQ(*access->Resolve("m.gguf"), models + "/m.gguf");
  EXPECT_EQ(*access->Resolve("sub/n.gguf"), models + "/sub/n.gguf");
  // A link inside that stays inside is fine (and resolved).
  fs::create_symlink(models + "/m.gguf", models + "/alias.gguf");
  EXPECT_EQ(*access->Resolve("alias.gguf"), models + "/m.gguf");
  fs::create_symlink(dir_ + "/outside/secret", models + "/escape.gguf");
  for (const std::string& model :
       {dir_ + "/outside/secret", dir_ + "/outside/missing", dir_ + "/models/../outside/secret",
        std::string("../outside/secret"), std::string("escape.gguf"), dir_ + "/models/escape.gguf",
        dir_ + "/models/sub", std::string("/etc/shadow"), std::string("/etc/passwd"), std::string(""),
        std::string("missing.gguf"), dir_ + "/models"}) {
    auto resolved = access->Resolve(model);
    ASSERT_FALSE(resolved.ok()) << model;
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(resolved.status().message(), ModelAccess::UnavailableMessage(model));
  }
  // No folder: nothing loads.
  auto none = ModelAccess::Create({{}, ""});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->Resolve(dir_ + "/models/m.gguf").ok());
  EXPECT_FALSE(ModelAccess::Create({{"relative"}, ""}).ok());
}

TEST_F(TrustTest, TheModelCacheIsOneMoreFolder) {
  fs::create_directories(dir_ + "/cache");
  std::ofstream(dir_ + "/cache/sha256-abc.gguf") << "GGUF";
  auto access = ModelAccess::Create({{dir_ + "/models"}, dir_ + "/cache"});
  ASSERT_TRUE(access.ok());
  EXPECT_TRUE(access->Resolve("sha256-abc.gguf").ok());
  EXPECT_EQ(access->ReadableFolders().size(), 2u);
}

// ------------------------------------------------------------------ the runner's sandbox

using SandboxRun = testing::ProgramRun;

SandboxRun Sandboxed(const std::vector<std::string>& args) {
  Subprocess::Options sp;
  sp.argv = {std::string(MINIONS_TEST_BIN_DIR) + "/minions-sandbox"};
  sp.argv.insert(sp.argv.end(), args.begin(), args.end());
  sp.extra_env = {"MINIONS_TOKEN=the-executors-own-secret"};
  SandboxRun run = testing::RunProgram(sp, absl::Seconds(30));
  if (!run.started) run.err.clear();  // as before: nothing on standard error when it never started
  return run;
}

bool HaveLandlock() {
#ifdef SYS_landlock_create_ruleset
  return syscall(SYS_landlock_create_ruleset, nullptr, 0, 1U) >= 1;
#else
  return false;
#endif
}

TEST_F(TrustTest, TheSandboxGivesOnlyTheEnvironmentItIsGiven) {
  SandboxRun run = Sandboxed({"--quiet", "--write", dir_ + "/scratch", "--env", "HOME=" + dir_ + "/scratch", "--", "/usr/bin/env"});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.out, "HOME=" + dir_ + "/scratch\n");
  EXPECT_THAT(run.out, Not(HasSubstr("MINIONS_TOKEN")));
}

#ifdef __linux__
TEST_F(TrustTest, TheSandboxConfinesFilesAndNetwork) {
  if (!HaveLandlock()) GTEST_SKIP() << "this kernel has no Landlock";
  const std::vector<std::string> base = {"--quiet", "--read", dir_ + "/models", "--write", dir_ + "/scratch", "--"};
  auto in_sandbox = [&](const std::string& script) {
    std::vector<std::string> args = base;
    args.insert(args.end(), {"/bin/sh", "-c", script});
    return Sandboxed(args);
  };
  EXPECT_EQ(in_sandbox("cat " + dir_ + "/models/m.gguf").out, "GGUF\n");
  EXPECT_NE(in_sandbox("cat " + dir_ + "/outside/secret").code, 0);
  EXPECT_NE(in_sandbox("cat /etc/passwd").code, 0);
  EXPECT_NE(in_sandbox("echo x > " + dir_ + "/models/planted").code, 0);
  EXPECT_NE(in_sandbox("echo x > " + dir_ + "/outside/planted").code, 0);
  EXPECT_EQ(in_sandbox("echo x > " + dir_ + "/scratch/mine && cat mine").out, "x\n");  // starts in the scratch folder
  EXPECT_FALSE(fs::exists(dir_ + "/models/planted"));
  EXPECT_FALSE(fs::exists(dir_ + "/outside/planted"));
  // No sockets of any family (bash's /dev/tcp opens one).
  SandboxRun tcp = Sandboxed({"--quiet", "--write", dir_ + "/scratch", "--", "/bin/bash", "-c", "echo x > /dev/tcp/127.0.0.1/9"});
  EXPECT_NE(tcp.code, 0);
  EXPECT_THAT(tcp.err, HasSubstr("socket: Operation not permitted"));
  // Another process's environment (the executor's, here: this test's) is out of reach.
  EXPECT_NE(in_sandbox("cat /proc/" + std::to_string(getpid()) + "/environ").code, 0);
  // And nothing it runs can lift it.
  SandboxRun nested = Sandboxed({"--quiet", "--write", dir_ + "/scratch", "--", std::string(MINIONS_TEST_BIN_DIR) + "/minions-sandbox",
                          "--quiet", "--read", "/etc", "--", "/bin/cat", "/etc/passwd"});
  EXPECT_NE(nested.code, 0);
}
#endif

// A gang's leader (docs/architecture.md, "Gangs"): its runner may reach its members' gate ports,
// and no other TCP port.
TEST_F(TrustTest, AGangLeadersSandboxConnectsToItsMembersPortsOnly) {
#ifdef SYS_landlock_create_ruleset
  if (syscall(SYS_landlock_create_ruleset, nullptr, 0, 1U) < 4) GTEST_SKIP() << "no Landlock TCP rules (ABI 4)";
#else
  GTEST_SKIP() << "no Landlock";
#endif
  auto listen_on_loopback = [](int* port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd, 4), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    *port = ntohs(addr.sin_port);
    return fd;
  };
  int member_port = 0, other_port = 0;
  const int member = listen_on_loopback(&member_port);
  const int other = listen_on_loopback(&other_port);
  auto connect_to = [&](int port) {
    return Sandboxed({"--quiet", "--connect-tcp", std::to_string(member_port), "--write", dir_ + "/scratch", "--",
                      "/bin/bash", "-c", "echo x > /dev/tcp/127.0.0.1/" + std::to_string(port)});
  };
  SandboxRun allowed = connect_to(member_port);
  EXPECT_EQ(allowed.code, 0) << allowed.err;
  SandboxRun refused = connect_to(other_port);
  EXPECT_NE(refused.code, 0);
  EXPECT_THAT(refused.err, HasSubstr("Permission denied"));
  // Without --connect-tcp: no socket at all, as for every other runner.
  SandboxRun none = Sandboxed({"--quiet", "--write", dir_ + "/scratch", "--", "/bin/bash", "-c",
                               "echo x > /dev/tcp/127.0.0.1/" + std::to_string(member_port)});
  EXPECT_NE(none.code, 0);
  close(member);
  close(other);
}

TEST_F(TrustTest, TheSandboxReportsWhatItApplied) {
  SandboxRun run = Sandboxed({"--write", dir_ + "/scratch", "--", "/bin/true"});
  EXPECT_EQ(run.code, 0) << run.err;
#ifdef __linux__
  EXPECT_THAT(run.err, HasSubstr(HaveLandlock() ? "landlock ABI" : "no landlock"));
  EXPECT_THAT(run.err, HasSubstr("seccomp, empty environment"));
#endif
  EXPECT_EQ(Sandboxed({"--no-such-flag", "--", "/bin/true"}).code, 126);
  EXPECT_EQ(Sandboxed({"--write", dir_ + "/scratch", "--", dir_ + "/no-such-program"}).code, 127);
}

// What an executor reports of its runners' confinement (Capabilities.confinement) is what the
// sandbox applies here: "full" only with Landlock (and seccomp), "partial" without it, "none" off.
TEST_F(TrustTest, TheExecutorReportsHowItsRunnersAreConfined) {
  EXPECT_EQ(sandbox::Confinement(false), "none");
#ifdef __linux__
  EXPECT_EQ(sandbox::LandlockAbi() > 0, HaveLandlock());
  EXPECT_EQ(sandbox::Confinement(true), HaveLandlock() ? "full" : "partial");
#endif
}

// 40.6a: by default an executor requires Landlock where the kernel's covers all the sandbox asks
// (ABI 4: files and TCP), so no runner starts less confined than the executor reports; on a kernel
// with less it confines as it can, and says so. What an owner asks for is kept as asked.
TEST_F(TrustTest, TheDefaultSandboxIsRequiredWhereTheKernelAllows) {
  EXPECT_EQ(*ResolveRunnerSandboxMode("auto", 6), "required");
  EXPECT_EQ(*ResolveRunnerSandboxMode("auto", 4), "required");
  EXPECT_EQ(*ResolveRunnerSandboxMode("auto", 3), "on");
  EXPECT_EQ(*ResolveRunnerSandboxMode("auto", 0), "on");
  for (const char* asked : {"on", "required", "off"}) EXPECT_EQ(*ResolveRunnerSandboxMode(asked, 6), asked);
  EXPECT_FALSE(ResolveRunnerSandboxMode("maybe", 6).ok());
  EXPECT_FALSE(ResolveRunnerSandboxMode("", 6).ok());
}

TEST_F(TrustTest, RunnerSandboxWrapsTheRunnerAndRefusesCredentialsInItsEnvironment) {
  RunnerSandboxOptions options;
  options.launcher = std::string(MINIONS_TEST_BIN_DIR) + "/minions-sandbox";
  options.model_folders = {dir_ + "/models"};
  options.scratch_dir = dir_ + "/scratch/runner";
  options.env = {"CUDA_VISIBLE_DEVICES=0"};
  auto sandbox = RunnerSandbox::Create(options);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status();
  std::vector<std::string> wrapped = (*sandbox)->Wrap({"/usr/bin/env", "-0"});
  EXPECT_EQ(wrapped.front(), options.launcher);
  EXPECT_EQ(wrapped[wrapped.size() - 2], "/usr/bin/env");
  EXPECT_EQ(wrapped.back(), "-0");
  EXPECT_TRUE(fs::is_directory(options.scratch_dir));
  EXPECT_EQ(fs::status(options.scratch_dir).permissions() & fs::perms::all, fs::perms::owner_all);
  for (const char* credential : {"MINIONS_TOKEN=x", "AWS_SECRET_ACCESS_KEY=x", "GITHUB_TOKEN=x", "DB_PASSWORD=x",
                                 "noequals"}) {
    RunnerSandboxOptions bad = options;
    bad.env = {credential};
    EXPECT_FALSE(RunnerSandbox::Create(bad).ok()) << credential;
  }
  // The wrapped command runs (bare names are found on PATH), with only the given environment.
  Subprocess::Options sp;
  sp.argv = (*sandbox)->Wrap({"env"});
  auto p = Subprocess::Start(sp);
  ASSERT_TRUE(p.ok());
  (*p)->CloseStdin();
  std::string out;
  for (auto line = (*p)->ReadLine(absl::Seconds(30)); line.ok(); line = (*p)->ReadLine(absl::Seconds(30))) out += *line + "\n";
  EXPECT_THAT(out, HasSubstr("CUDA_VISIBLE_DEVICES=0"));
  EXPECT_THAT(out, HasSubstr("TMPDIR=" + options.scratch_dir));
  EXPECT_THAT(out, Not(HasSubstr("PATH=")));
}

TEST(MacProfile, DeniesByDefaultReadsModelsWritesScratchAndHasNoNetwork) {
  sandbox::Policy policy;
  policy.read_only = {"/Users/owner/models", "/usr/lib"};
  policy.read_write = {"/Users/owner/.minions/executor/runner-scratch"};
  std::string profile = sandbox::MacProfile(policy, "/opt/minions/bin/minions-llama-runner");
  EXPECT_THAT(profile, HasSubstr("(deny default)"));
  EXPECT_THAT(profile, HasSubstr("(deny network*)"));
  EXPECT_THAT(profile, HasSubstr("(allow process-exec (literal \"/opt/minions/bin/minions-llama-runner\"))"));
  EXPECT_THAT(profile, HasSubstr("(subpath \"/Users/owner/models\")"));
  EXPECT_THAT(profile, HasSubstr("(allow file-read* file-write*\n  (subpath \"/Users/owner/.minions/executor/runner-scratch\"))"));
  // The models are in the read-only rule, never in the read-write one.
  EXPECT_EQ(profile.find("file-write*\n  (subpath \"/Users/owner/models\")"), std::string::npos);
  // Paths are quoted: a folder named with a quote cannot break out of its rule.
  policy.read_only = {"/tmp/a\")(allow default)(\""};
  EXPECT_THAT(sandbox::MacProfile(policy, "/r"), HasSubstr("\"/tmp/a\\\")(allow default)(\\\"\""));
}

// ------------------------------------------------------------------ least privilege

TEST(Install, TheExecutorRunsAsItsOwnUnprivilegedAccount) {
  InstallOptions linux_options;
  linux_options.platform = "linux";
  std::string unit = *ServiceFile(linux_options);
  for (const char* line : {"User=minions-executor\n", "Group=minions-executor\n", "NoNewPrivileges=yes\n",
                           "ProtectSystem=strict\n", "ProtectHome=yes\n", "PrivateTmp=yes\n",
                           "CapabilityBoundingSet=\n", "AmbientCapabilities=\n", "UMask=0077\n",
                           "StateDirectoryMode=0700\n", "RestrictSUIDSGID=yes\n", "RestrictNamespaces=yes\n"}) {
    EXPECT_THAT(unit, HasSubstr(line));
  }
  // /dev/input is not granted by default: logind answers where it can.
  EXPECT_THAT(unit, HasSubstr("# SupplementaryGroups=input"));
  EXPECT_THAT(unit, Not(HasSubstr("\nSupplementaryGroups=input")));
  InstallOptions mac;
  mac.platform = "macos";
  std::string plist = *ServiceFile(mac);
  EXPECT_THAT(plist, HasSubstr("<key>UserName</key>\n  <string>_minions</string>"));
  EXPECT_THAT(plist, HasSubstr("<key>Umask</key>\n  <integer>63</integer>"));
}

TEST(Install, TheAccountIsMadeWhenMissingAndOnlyThen) {
  InstallOptions linux_options;
  linux_options.platform = "linux";
  auto missing = ServiceAccountCommands(linux_options, [](const std::string&) { return false; });
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].front(), "useradd");
  EXPECT_EQ(missing[0].back(), "minions-executor");
  EXPECT_THAT(missing[0], ::testing::Contains("--system"));
  EXPECT_THAT(missing[0], ::testing::Contains("/usr/sbin/nologin"));
  EXPECT_TRUE(ServiceAccountCommands(linux_options, [](const std::string&) { return true; }).empty());
  InstallOptions mac;
  mac.platform = "macos";
  auto mac_missing = ServiceAccountCommands(mac, [](const std::string&) { return false; });
  auto mac_exists = ServiceAccountCommands(mac, [](const std::string&) { return true; });
  EXPECT_GT(mac_missing.size(), mac_exists.size());
  EXPECT_THAT(mac_missing[0], ::testing::ElementsAre("dscl", ".", "-create", "/Groups/_minions", "PrimaryGroupID", "471"));
  bool hidden = false;
  for (const auto& argv : mac_missing) hidden |= argv.size() == 6 && argv[4] == "IsHidden" && argv[5] == "1";
  EXPECT_TRUE(hidden);
  // Folders are made and handed to the account either way.
  EXPECT_EQ(mac_exists.back(), (std::vector<std::string>{"chmod", "700", "/Library/Application Support/Minions/executor",
                                                         "/Library/Logs/Minions"}));
}

}  // namespace
}  // namespace minions
