#pragma once
// llama.cpp's llama-server as a benchmark baseline, shared by minions-bench-runner and
// minions-bench-schema: the child process (its output into a log, stopped on destruction, killed
// when the benchmark is interrupted), an HTTP client, and where bench/build-llama-tools put the
// tools. Benchmark programs only; every call is from the benchmark's own threads (PostAll's client
// threads each have their own HttpClient).

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <curl/curl.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "llama.h"
#include "runner/llama/devices.h"
#include "testing/process_pool.h"

namespace minions::bench {

// The benchmark cannot go on: says why and ends it.
[[noreturn]] inline void DieWith(const std::string& message) {
  std::fprintf(stderr, "benchmark error: %s\n", message.c_str());
  std::exit(1);
}

// ---------------------------------------------------------------------------------------------
// Child processes: stdout and stderr into a log file (nothing to drain), stopped on destruction,
// and killed when the benchmark itself is interrupted (install KillChildrenAndExit for SIGINT and
// SIGTERM).

inline std::atomic<pid_t> g_children[16];

inline void KillChildrenAndExit(int sig) {
  for (auto& pid : g_children) {
    pid_t p = pid.load();
    if (p > 0) kill(p, SIGKILL);
  }
  _exit(128 + sig);
}

class Child {
 public:
  static std::unique_ptr<Child> Start(const std::vector<std::string>& argv, const std::string& log) {
    Subprocess::Options sp;
    sp.argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" >>\"$MINIONS_BENCH_LOG\" 2>&1"};
    sp.argv.insert(sp.argv.end(), argv.begin(), argv.end());
    sp.extra_env = {"MINIONS_BENCH_LOG=" + log};
    auto process = Subprocess::Start(sp);
    if (!process.ok()) DieWith(absl::StrCat("cannot start ", argv[0], ": ", std::string(process.status().message())));
    auto child = std::make_unique<Child>();
    child->process_ = std::move(*process);
    for (auto& slot : g_children) {
      pid_t expected = 0;
      if (slot.compare_exchange_strong(expected, child->process_->pid())) break;
    }
    return child;
  }
  ~Child() {
    for (auto& slot : g_children) {
      pid_t expected = process_->pid();
      slot.compare_exchange_strong(expected, 0);
    }
    process_->Signal(SIGTERM);
    if (!process_->Wait(absl::Seconds(10)).ok()) {
      process_->Signal(SIGKILL);
      (void)process_->Wait(absl::Seconds(10));
    }
  }
  bool running() { return process_->running(); }

 private:
  std::unique_ptr<Subprocess> process_;
};

// ---------------------------------------------------------------------------------------------
// HTTP with libcurl: one handle per thread, so connections are kept alive.

class HttpClient {
 public:
  HttpClient() : curl_(curl_easy_init()) {}
  ~HttpClient() { curl_easy_cleanup(curl_); }
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;
  // Status and body; status 0 when nothing answered.
  std::pair<long, std::string> Request(const std::string& url, const std::string* post_body, long timeout_s = 3600) {
    std::string body;
    curl_easy_reset(curl_);
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT, timeout_s);
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t n, void* out) {
      static_cast<std::string*>(out)->append(data, size * n);
      return size * n;
    });
    curl_slist* headers = nullptr;
    if (post_body) {
      headers = curl_slist_append(headers, "Content-Type: application/json");
      curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers);
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, post_body->c_str());
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE, static_cast<long>(post_body->size()));
    }
    long status = 0;
    if (curl_easy_perform(curl_) == CURLE_OK) curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &status);
    if (headers) curl_slist_free_all(headers);
    return {status, body};
  }

 private:
  CURL* curl_;
};

// ---------------------------------------------------------------------------------------------
// llama-server on a free local port, healthy once constructed.

struct ServerSettings {
  int parallel = 8;
  int ctx_per_seq = 2048;
  int threads = 2;
  bool embeddings = false;
};

class LlamaServerProcess {
 public:
  LlamaServerProcess(const std::string& bin, const std::string& model, const ServerSettings& s, const std::string& log)
      : port_(testing::PickFreePort()) {
    std::vector<std::string> argv = {bin, "-m", model, "--host", "127.0.0.1", "--port", std::to_string(port_),
                                     "-np", std::to_string(s.parallel), "-c", std::to_string(s.parallel * s.ctx_per_seq),
                                     "-t", std::to_string(s.threads), "-tb", std::to_string(s.threads), "-ngl", GpuLayers(),
                                     // as the runner: separate KV streams, flash attention as it sets it
                                     "--no-kv-unified", "-fa", FlashAttn(), "--no-webui", "--no-warmup"};
    if (s.embeddings) {
      // Every input must fit one micro-batch.
      argv.insert(argv.end(), {"--embeddings", "--pooling", "mean", "-b", "2048", "-ub", "2048"});
    }
    child_ = Child::Start(argv, log);
    HttpClient http;
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      if (http.Request(Url("/health"), nullptr, 5).first == 200) break;
      if (!child_->running()) DieWith(absl::StrCat("llama-server exited during start; see ", log));
      if (std::chrono::steady_clock::now() - start > std::chrono::minutes(10)) {
        DieWith(absl::StrCat("llama-server did not become healthy; see ", log));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  // The runner's settings: flash attention off on a machine without an accelerator of its own, and
  // no layers offloaded there. Not llama_supports_gpu_offload(): it is true whenever the RPC backend
  // is compiled in (it is), and llama.cpp's `auto` turns flash attention on for the CPU.
  static const char* FlashAttn() { return llama_runner::LocalAccelerators().empty() ? "off" : "auto"; }
  static const char* GpuLayers() { return llama_runner::LocalAccelerators().empty() ? "0" : "999"; }

  std::string Url(const std::string& path) const { return absl::StrCat("http://127.0.0.1:", port_, path); }

  // Posts each request (path, JSON body) from `concurrency` client threads, each sending the next
  // as soon as its last is answered; `on_reply(index, status, body)` is called under one lock.
  // Returns the seconds from the first send to the last answer.
  double PostAll(const std::vector<std::pair<std::string, std::string>>& requests, int concurrency,
                 const std::function<void(size_t, long, const std::string&)>& on_reply) {
    std::mutex mu;
    std::atomic<size_t> next{0};
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> clients;
    for (int c = 0; c < concurrency; ++c) {
      clients.emplace_back([&] {
        HttpClient http;
        while (true) {
          const size_t i = next++;
          if (i >= requests.size()) return;
          auto [status, reply] = http.Request(Url(requests[i].first), &requests[i].second);
          std::lock_guard<std::mutex> lock(mu);
          on_reply(i, status, reply);
        }
      });
    }
    for (auto& t : clients) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  int port_;
  std::unique_ptr<Child> child_;
};

// What bench/build-llama-tools built: MINIONS_CACHE/llama.cpp-<version>-<variant>-tools/bin,
// a GPU variant (cuda, metal) before cpu, the newest version first; "" when there is none. The
// folder is found by its shape rather than rebuilt from the version and variant here, which
// drifted from the script's before (llama_supports_gpu_offload() is true for a CPU build with
// RPC, so the "cpu" folder was never looked for).
inline std::string DefaultToolsDir() {
  const char* cache = std::getenv("MINIONS_CACHE");
  const char* home = std::getenv("HOME");
  const std::string base = cache && *cache ? cache : absl::StrCat(home ? home : "", "/.cache/minions");
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(base, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("llama.cpp-", 0) != 0 || !absl::EndsWith(name, "-tools")) continue;
    if (std::filesystem::exists(entry.path() / "bin" / "llama-server")) found.push_back((entry.path() / "bin").string());
  }
  std::sort(found.rbegin(), found.rend());
  for (const char* variant : {"-cuda-tools", "-metal-tools", "-cpu-tools"}) {
    for (const std::string& dir : found) {
      if (dir.find(variant) != std::string::npos) return dir;
    }
  }
  return found.empty() ? "" : found.front();
}

}  // namespace minions::bench
