// minions-bench-availability: how fast an executor gives the machine back to its owner, and what
// an executor at rest costs the owner (docs/benchmarks.md records the figures and this command).
//
//   yield    owner activity (injected through the control socket, as `minions executor activity`)
//            -> runner stopped (idle after its batch was cancelled at its next step, or SIGSTOP),
//            --trials times; the same with
//            an input event on a (FIFO) input device the executor's /dev/input probe watches; then
//            with release_after=0 -> runner process gone (its memory returned). Targets: p99 < 1 s,
//            < 5 s.
//            --runner picks the runner (default the CPU one): the vulkan runner's runner is stopped
//            with its device work, e.g. `--runner build/apps/minions-llama-runner-vulkan
//            --runner-env GGML_VK_VISIBLE_DEVICES=0` (Mesa's lavapipe); --series picks the series.
//   rest     an idle executor's RSS and CPU over --rest-seconds, with the platform's real probes:
//            available (long-polling an idle server) and owner_active (fail closed, waiting).
//            Targets: < 25 MB RSS, < 0.2 % of one core.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench_util.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/sample_prompts.h"
#include "common/subprocess.h"
#include "executor/control_channel.h"
#include "testing/process_pool.h"

namespace {

using minions::testing::ProcessPool;

using minions::bench::BinDir;
using minions::bench::Slurp;

// Fields of /proc/<pid>/stat after the command name (field 3 is [0]).
std::vector<std::string> StatFields(int pid) {
  std::string text = Slurp(absl::StrCat("/proc/", pid, "/stat"));
  size_t close = text.rfind(')');
  if (close == std::string::npos) return {};
  return absl::StrSplit(text.substr(close + 2), ' ');
}

int ChildOf(int parent, const std::string& name) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    int pid = atoi(entry.path().filename().c_str());
    if (pid <= 0) continue;
    auto f = StatFields(pid);
    if (f.size() > 1 && atoi(f[1].c_str()) == parent &&
        Slurp(absl::StrCat("/proc/", pid, "/comm")).find(name) != std::string::npos) {
      return pid;
    }
  }
  return 0;
}

// The process's state: 'X' gone, 'T' stopped, 'R' when any of its threads runs (a device
// runner's main thread waits on the device while others compute: lavapipe's are the runner's own
// threads), else its main thread's.
char State(int pid) {
  auto f = StatFields(pid);
  if (f.empty()) return 'X';
  if (f[0][0] == 'T' || f[0][0] == 'R') return f[0][0];
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    std::string text = Slurp(task.path().string() + "/stat");
    size_t close = text.rfind(')');
    if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'R') return 'R';
  }
  return f[0][0];
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

void Print(const char* what, const std::vector<double>& ms, double target_ms) {
  printf("  %-52s n=%zu  p50 %7.1f ms  p99 %7.1f ms  max %7.1f ms  (target p99 < %.0f ms: %s)\n", what, ms.size(),
         Percentile(ms, 0.5), Percentile(ms, 0.99), ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end()),
         target_ms, !ms.empty() && Percentile(ms, 0.99) < target_ms ? "met" : "NOT met");
}

std::vector<std::string> OwnerArgs(const std::string& release_after) {
  // Only reported activity steers this executor: the measurement must not depend on this
  // machine's own owner, CPU or GPU load.
  std::vector<std::string> args = {"--availability", "dedicated"};
  for (std::string kv : {"probe_logind=false", "probe_input_devices=false", "probe_nvml=false",
                         "start_max_other_cpu=1", "pause_other_cpu=1", "start_idle=1s", "resume_idle=1s",
                         "min_paused=0s", "stop_after=1h"}) {
    args.insert(args.end(), {"--availability-set", kv});
  }
  args.insert(args.end(), {"--availability-set", "release_after=" + release_after});
  return args;
}

// A job long enough to keep the runner busy for the whole measurement.
bool SubmitLongJob(ProcessPool& pool, const std::string& model) {
  minions::cli::SamplePromptOptions sample;
  sample.records = 4000;
  sample.max_tokens = 64;
  sample.include_bad_lines = false;
  std::string input;
  for (const auto& l : minions::cli::SamplePromptLines(sample)) input += l + "\n";
  minions::v1::SubmitJobRequest request;
  request.set_input(input);
  request.set_model(model);
  request.set_shard_size(400);
  auto job = minions::cli::JobsClient(pool.connection()).Submit(request);
  if (!job.ok()) fprintf(stderr, "submit: %s\n", std::string(job.status().message()).c_str());
  return job.ok();
}

// Waits until the executor runs a busy runner again; returns its pid (0: timed out).
int WaitBusyRunner(ProcessPool& pool, const std::string& name) {
  int executor = pool.executor(name).pid();
  for (int i = 0; i < 600; ++i) {
    int runner = ChildOf(executor, "minions-llama");
    if (runner && State(runner) == 'R') return runner;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return 0;
}

// Yield and Rest return whether they measured every trial: a benchmark that measures nothing has
// rotted, and the suite's smoke run (tests/bench) fails on it.
// The runner the yield series run (docs/benchmarks.md, "Owner first"); "" is the CPU runner.
struct RunnerChoice {
  std::string program;
  std::vector<std::string> env;  // NAME=VALUE, the runner's
  std::vector<std::string> series = {"paused", "input", "release"};
  std::vector<std::string> settings;  // KEY=VALUE, more --availability-set (pause_grace=0s...)
};

bool Yield(const std::string& work, const std::string& model, int trials, const RunnerChoice& runner_choice) {
  printf("\n== yield: owner activity -> runner paused / released (%d trials each, runner %s) ==\n", trials,
         runner_choice.program.empty() ? "minions-llama-runner (CPU)" : runner_choice.program.c_str());
  // An input device for the third series: a FIFO standing in for /dev/input/event0 under a
  // probe root, written to as a keyboard would be.
  std::string root = work + "/fake-root";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/dev/input");
  std::string device = root + "/dev/input/event0";
  mkfifo(device.c_str(), 0600);
  int keyboard = open(device.c_str(), O_RDWR | O_NONBLOCK);
  struct Series {
    const char* key;
    const char* name;
    std::string release_after;
    bool by_device;
  };
  for (const Series& series : {Series{"paused", "activity -> runner paused (its next step, or SIGSTOP)", "1h", false},
                               Series{"input", "input event -> runner paused (/dev/input)", "1h", true},
                               Series{"release", "activity -> runner gone (release_after=0s)", "0s", false}}) {
    if (std::find(runner_choice.series.begin(), runner_choice.series.end(), series.key) == runner_choice.series.end()) {
      continue;
    }
    bool release = series.release_after == "0s";
    ProcessPool pool(BinDir() + "/minions", work + "/yield", 9000);
    pool.AllowModels({std::filesystem::path(model).parent_path().string()});
    std::vector<std::string> args = OwnerArgs(series.release_after);
    for (const std::string& kv : runner_choice.settings) args.insert(args.end(), {"--availability-set", kv});
    if (series.by_device) {
      args.insert(args.end(), {"--availability-set", "probe_input_devices=true", "--availability-set",
                               "probe_root=" + root});
    }
    if (!runner_choice.program.empty()) {
      // A device runner may compile its kernels on first use (lavapipe: its shaders, minutes):
      // silent that long, and started with the Mesa shader cache this user's runs filled.
      args.insert(args.end(), {"--runner-hang-ms", "1800000"});
      if (const char* home = getenv("HOME")) {
        std::error_code ec;
        std::filesystem::create_directories(pool.dir() + "/owner/runner-scratch/.cache", ec);
        std::filesystem::copy(std::string(home) + "/.cache/mesa_shader_cache",
                              pool.dir() + "/owner/runner-scratch/.cache/mesa_shader_cache",
                              std::filesystem::copy_options::recursive, ec);
      }
    }
    if (!pool.StartServer().ok() ||
        !pool.StartExecutor("owner", 1, runner_choice.program, "", args, runner_choice.env).ok() ||
        !SubmitLongJob(pool, model)) {
      fprintf(stderr, "cannot start the pool; see %s\n", pool.dir().c_str());
      return false;
    }
    std::string socket = minions::ControlSocketPath(pool.dir() + "/owner");
    std::vector<double> ms;
    int at_boundary = 0;  // trials whose runner stopped its batch (cancelled) within the grace, not SIGSTOPped
    for (int t = 0; t < trials; ++t) {
      int runner = WaitBusyRunner(pool, "owner");
      if (!runner) {
        fprintf(stderr, "the runner never got busy; see %s/logs\n", pool.dir().c_str());
        break;
      }
      absl::SleepFor(absl::Milliseconds(300 + 37 * t));  // mid-batch, at varying phases of the probe cadence
      absl::Time start = absl::Now();
      if (series.by_device) {
        char event[24] = {1};
        if (write(keyboard, event, sizeof event) != sizeof event) break;
      } else if (!minions::SendControlCommand(socket, "activity").ok()) {
        break;
      }
      // Paused: stopped (SIGSTOP), or, when its batch ended within the grace, fed nothing more and
      // off the CPU (not running for 200 ms on end: a runner at work is hardly ever off it that
      // long), timed from when it left the CPU. Released: gone.
      bool reached = false;
      absl::Time end = absl::Now(), off_cpu_since = absl::InfiniteFuture();
      while (!reached && absl::Now() - start < absl::Seconds(10)) {
        const char state = State(runner);
        end = absl::Now();
        reached = release ? state == 'X' : state == 'T';
        if (!reached && !release) {
          if (state == 'R') {
            off_cpu_since = absl::InfiniteFuture();
          } else if (off_cpu_since == absl::InfiniteFuture()) {
            off_cpu_since = end;
          } else if (end - off_cpu_since >= absl::Milliseconds(200)) {
            reached = true;
            end = off_cpu_since;
            ++at_boundary;
          }
        }
        if (!reached) absl::SleepFor(absl::Microseconds(500));
      }
      if (!reached) {
        fprintf(stderr, "%s: the runner was neither paused nor gone 10 s after the owner came; see %s/logs\n",
                series.name, pool.dir().c_str());
        break;
      }
      ms.push_back(absl::ToDoubleMilliseconds(end - start));
      // The owner leaves again: resume_idle later the executor resumes (or starts a new runner).
    }
    Print(series.name, ms, release ? 5000 : 1000);
    if (at_boundary > 0) printf("    (%d of them idle after a cancelled batch within the grace, not SIGSTOPped)\n", at_boundary);
    if (static_cast<int>(ms.size()) != trials) {
      close(keyboard);
      return false;
    }
  }
  close(keyboard);
  return true;
}

struct Usage {
  double rss_mb = 0, cpu_percent = 0;
};

Usage Measure(int pid, absl::Duration over) {
  auto ticks = [&] {
    auto f = StatFields(pid);
    return f.size() > 12 ? atoll(f[11].c_str()) + atoll(f[12].c_str()) : 0LL;
  };
  long long before = ticks();
  absl::Time start = absl::Now();
  absl::SleepFor(over);
  long long after = ticks();
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Usage u;
  u.cpu_percent = 100.0 * (after - before) / sysconf(_SC_CLK_TCK) / seconds;
  for (absl::string_view line : absl::StrSplit(Slurp(absl::StrCat("/proc/", pid, "/status")), '\n')) {
    if (absl::StartsWith(line, "VmRSS:")) u.rss_mb = atof(std::string(line.substr(6)).c_str()) / 1024;
  }
  return u;
}

bool Rest(const std::string& work, int seconds) {
  printf("\n== executor at rest, real probes, %d s each ==\n", seconds);
  for (std::string mode : {"dedicated", "owner"}) {
    ProcessPool pool(BinDir() + "/minions", work + "/rest-" + mode, 9000);
    std::vector<std::string> args = {"--availability", mode};
    // The dedicated executor must be available whatever else this machine runs.
    if (mode == "dedicated") args.insert(args.end(), {"--availability-set", "start_max_other_cpu=1"});
    if (!pool.StartServer().ok() || !pool.StartExecutor("rest", 1, "", "", args).ok()) return false;
    absl::SleepFor(absl::Seconds(5));  // registered, first samples taken
    Usage u = Measure(pool.executor("rest").pid(), absl::Seconds(seconds));
    std::string state = "?";
    auto executors = minions::cli::JobsClient(pool.connection()).Executors();
    if (executors.ok() && !executors->empty()) state = (*executors)[0].state() + ": " + (*executors)[0].state_reason();
    printf("  %-40s RSS %5.1f MB (target < 25: %s)  CPU %.3f %% of a core (target < 0.2: %s)\n", state.c_str(),
           u.rss_mb, u.rss_mb < 25 ? "met" : "NOT met", u.cpu_percent, u.cpu_percent < 0.2 ? "met" : "NOT met");
    if (u.rss_mb <= 0) return false;  // the executor was gone: nothing measured
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"minions-bench-availability: yield latency and the cost of an executor at rest"};
  std::string mode = "all", work = "/tmp/minions-bench-availability", model;
  int trials = 20, rest_seconds = 30;
  RunnerChoice runner;
  app.add_option("--mode", mode, "yield, rest or all")->check(CLI::IsMember({"yield", "rest", "all"}))->capture_default_str();
  app.add_option("--work", work, "scratch directory")->capture_default_str();
  app.add_option("--model", model, "GGUF model (default: a test model made here)");
  app.add_option("--trials", trials, "owner returns per measurement")->capture_default_str();
  app.add_option("--rest-seconds", rest_seconds, "measurement window at rest")->capture_default_str();
  app.add_option("--runner", runner.program, "the runner of the yield series (default: the CPU one)");
  app.add_option("--runner-env", runner.env, "NAME=VALUE for the runner (repeatable)");
  app.add_option("--series", runner.series, "yield series: paused, input, release")
      ->delimiter(',')
      ->check(CLI::IsMember({"paused", "input", "release"}))
      ->capture_default_str();
  app.add_option("--availability-set", runner.settings, "KEY=VALUE for the executor's policy (repeatable), e.g. "
                                                        "pause_grace=0s");
  CLI11_PARSE(app, argc, argv);
  std::filesystem::create_directories(work);
  if (model.empty()) {
    model = work + "/text.gguf";
    minions::Subprocess::Options sp;
    sp.argv = {BinDir() + "/minions-make-test-model", "-o", model};
    auto maker = minions::Subprocess::Start(sp);
    if (!maker.ok() || !(*maker)->Wait().ok()) return 1;
  }
  bool measured = true;
  if (mode == "yield" || mode == "all") measured &= Yield(work, model, trials, runner);
  if (mode == "rest" || mode == "all") measured &= Rest(work, rest_seconds);
  return measured ? 0 : 1;
}
