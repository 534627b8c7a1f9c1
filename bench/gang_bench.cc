// minions-bench-gang: what splitting a model over a gang costs. The same model and records through
// minions-llama-runner alone and as the leader of a gang of 2 and 3 (1 and 2 rpc-servers behind
// GangMember gates, all on loopback), sides interleaved, --repeat passes each; tokens per second
// of each side as a ratio to the runner alone, and the bytes the gates forwarded per generated
// token (what a real link between machines would carry).
//
//   build/apps/minions-bench-gang --shape 0.5b --type q4_0 --threads 1 --records 8 --max-tokens 32

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "bench_util.h"
#include "common/random_hex.h"
#include "executor/gang_member.h"
#include "executor/gang_tunnel.h"
#include "runner/runner_process.h"

namespace minions::bench {
namespace {

struct Options {
  std::string model;
  std::string shape = "0.5b";
  std::string type = "q4_0";
  int threads = 1;
  int parallel = 4;
  int records = 8;
  int max_tokens = 32;
  int repeat = 3;
  std::vector<int> gangs = {2, 3};
};

std::string LoadAverage() {
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) != 3) return "unknown";
  return absl::StrFormat("%u cores, load average %.2f %.2f %.2f", std::thread::hardware_concurrency(), load[0],
                         load[1], load[2]);
}

std::string EnsureModel(const Options& opt) {
  if (!opt.model.empty()) return opt.model;
  const char* home = std::getenv("HOME");
  std::string dir = std::string(home ? home : "/tmp") + "/.cache/minions/bench-models";
  std::string path = dir + "/shape-" + opt.shape + "-" + opt.type + ".gguf";
  struct stat st;
  if (stat(path.c_str(), &st) == 0) return path;
  std::string out;
  mkdir(dir.c_str(), 0755);
  auto made = RunProgram({BinDir() + "/minions-make-test-model", "--shape", opt.shape, "--type", opt.type, "-o", path},
                         "/dev/null", out);
  if (!made.ok()) {
    fprintf(stderr, "%s\n", std::string(made.message()).c_str());
    std::exit(1);
  }
  return path;
}

struct Side {
  std::string name;
  int members = 0;  // rpc-servers besides the leader
  std::vector<std::unique_ptr<GangMember>> gang;
  // The runner reaches each member through a tunnel that proves the side's secret to the member's
  // gate, as a leader's executor does (executor/gang_tunnel.h).
  std::vector<std::unique_ptr<GangTunnel>> tunnels;
  std::unique_ptr<RunnerProcess> runner;
  std::vector<double> tokens_per_second;
  double bytes_per_token = 0;
};

int64_t GateBytes(const Side& side) {
  int64_t total = 0;
  for (const auto& m : side.gang) total += m->bytes_in() + m->bytes_out();
  return total;
}

int Main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Tokens per second of a gang of 2 and 3 on loopback against the runner alone"};
  app.add_option("--model", opt.model, "GGUF model (default: the --shape model, written once into the cache)");
  app.add_option("--shape", opt.shape, "shape of the default model")->capture_default_str();
  app.add_option("--type", opt.type, "weights of the default model")->capture_default_str();
  app.add_option("--threads", opt.threads, "threads of the runner and of each rpc-server")->capture_default_str();
  app.add_option("--parallel", opt.parallel, "sequences decoded together")->capture_default_str();
  app.add_option("--records", opt.records, "records per pass")->capture_default_str();
  app.add_option("--max-tokens", opt.max_tokens, "tokens each record generates")->capture_default_str();
  app.add_option("--repeat", opt.repeat, "passes per side (the median counts)")->capture_default_str();
  app.add_option("--gangs", opt.gangs, "gang sizes (leader included)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::string model = EnsureModel(opt);
  printf("model %s; %d records x %d tokens, parallel %d, %d thread(s) per process\nstart: %s\n", model.c_str(),
         opt.records, opt.max_tokens, opt.parallel, opt.threads, LoadAverage().c_str());

  std::vector<Side> sides;
  sides.push_back({"runner alone", 0});
  for (int size : opt.gangs) sides.push_back({absl::StrFormat("gang of %d", size), size - 1});
  for (Side& side : sides) {
    runner_protocol::LoadRequest load{model, {}};
    load.options.n_parallel = opt.parallel;
    load.options.n_ctx_per_seq = 256;
    load.options.n_threads = opt.threads;
    load.options.flash_attn = "off";
    for (int i = 0; i < side.members; ++i) {
      GangMemberOptions member;
      member.rpc_server = BinDir() + "/ggml-rpc-server";
      member.bind_host = "127.0.0.1";
      member.leader_host = "127.0.0.1";
      member.threads = opt.threads;
      member.stderr_path = "/dev/null";
      member.secret = RandomHex(32);
      auto started = GangMember::Start(member);
      if (!started.ok()) {
        fprintf(stderr, "%s\n", std::string(started.status().message()).c_str());
        return 1;
      }
      auto tunnel = GangTunnel::Start({(*started)->endpoint(), member.secret});
      if (!tunnel.ok()) {
        fprintf(stderr, "%s\n", std::string(tunnel.status().message()).c_str());
        return 1;
      }
      load.gang.servers.push_back({(*tunnel)->endpoint(), 1 << 30});
      side.gang.push_back(std::move(*started));
      side.tunnels.push_back(std::move(*tunnel));
    }
    if (side.members > 0) load.gang.leader_bytes = 1 << 30;  // equal shares
    RunnerProcess::Options ro;
    ro.command = {BinDir() + "/minions-llama-runner"};
    auto runner = RunnerProcess::Start(ro);
    if (!runner.ok()) return fprintf(stderr, "%s\n", std::string(runner.status().message()).c_str()), 1;
    for (auto& tunnel : side.tunnels) tunnel->AdmitProcess((*runner)->pid());
    auto info = (*runner)->Load(load);
    if (!info.ok()) return fprintf(stderr, "%s\n", std::string(info.status().message()).c_str()), 1;
    side.runner = std::move(*runner);
  }

  for (int pass = 0; pass < opt.repeat; ++pass) {
    for (Side& side : sides) {  // interleaved: every side once per pass
      std::vector<std::string> records;
      for (int i = 0; i < opt.records; ++i) {
        records.push_back(DumpJson({{"custom_id", absl::StrFormat("p%d-%d", pass, i)},
                                    {"prompt", absl::StrFormat("Pass %d, story %d: once upon a time", pass, i)},
                                    {"max_tokens", opt.max_tokens},
                                    {"temperature", 0}}));
      }
      const int64_t bytes_before = GateBytes(side);
      auto start = std::chrono::steady_clock::now();
      auto done = side.runner->RunBatch(absl::StrFormat("p%d", pass), records, [](size_t, const Json&) {});
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!done.ok()) return fprintf(stderr, "%s\n", std::string(done.status().message()).c_str()), 1;
      const double tokens = (*done)["usage"]["completion_tokens"].get<double>();
      side.tokens_per_second.push_back(tokens / seconds);
      if (side.members > 0) side.bytes_per_token = (GateBytes(side) - bytes_before) / std::max(tokens, 1.0);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double alone = median(sides[0].tokens_per_second);
  printf("\n| side | tokens/s (median) | range | vs alone | bytes over the gates per token |\n|---|---|---|---|---|\n");
  for (Side& side : sides) {
    auto [lo, hi] = std::minmax_element(side.tokens_per_second.begin(), side.tokens_per_second.end());
    const double m = median(side.tokens_per_second);
    printf("| %s | %.1f | %.1f-%.1f | %.2fx | %s |\n", side.name.c_str(), m, *lo, *hi, m / alone,
           side.members > 0 ? absl::StrFormat("%.0f", side.bytes_per_token).c_str() : "-");
  }
  printf("\nend: %s\n", LoadAverage().c_str());
  for (Side& side : sides) side.runner->Shutdown();
  // A side that generated nothing measured nothing (the suite's smoke run fails on it).
  for (const Side& side : sides) {
    if (median(side.tokens_per_second) <= 0) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace minions::bench

int main(int argc, char** argv) { return minions::bench::Main(argc, argv); }
