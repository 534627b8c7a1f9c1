// The vulkan runner (minions-llama-runner-vulkan: the pinned llama.cpp's prebuilt Vulkan backend)
// on a real Vulkan device: Mesa's lavapipe on machines without a GPU (GGML_VK_VISIBLE_DEVICES=0:
// ggml skips CPU-type Vulkan devices unless told). A separate device with its own buffers,
// kernels and offload decisions, the paths a Metal or CUDA executor takes:
//   - detection: the runner lists the device; the CPU runner lists none
//   - offload: every layer's weights in the device's buffers (llama.cpp's own account)
//   - agreement with the CPU runner, greedy text and embeddings, within the bound
//     docs/runner-protocol.md ("Backends") documents
//   - a pool job on an executor that runs the vulkan runner, which reports the accelerator
// These tests skip, saying why, only where this build has no vulkan runner (scripts/setup could
// not fetch the package) or the machine no Vulkan device (no mesa-vulkan-drivers).

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "cli/client_verbs.h"
#include "executor/runner_devices.h"
#include "runner/runner_process.h"
#include "llama_runner_process.h"
#include "test_env.h"
#include "testing/process_pool.h"

namespace minions {
namespace {

using minions::testing::RunRecords;
using minions::testing::TestModel;
using minions::testing::TestProgram;

const std::vector<std::string> kLavapipe = {"GGML_VK_VISIBLE_DEVICES=0"};

std::string VulkanRunner() { return TestProgram("minions-llama-runner-vulkan"); }

// Why the Vulkan tests cannot run here; "" when they can.
const std::string& SkipReason() {
  static const std::string reason = []() -> std::string {
    if (!std::filesystem::exists(VulkanRunner())) {
      return "this build has no vulkan runner: scripts/setup could not fetch the npm package "
             "@node-llama-cpp/linux-x64-vulkan (or MINIONS_VULKAN=0, or not Linux x86-64)";
    }
    auto devices = QueryRunnerDevices({VulkanRunner()}, kLavapipe);
    if (!devices.ok()) devices = QueryRunnerDevices({VulkanRunner()}, {});
    if (!devices.ok()) return absl::StrCat("the vulkan runner cannot list devices: ", devices.status().message());
    auto accelerator = AcceleratorFromDevices(*devices);
    if (!accelerator || accelerator->kind != "vulkan") {
      return "no Vulkan device on this machine (apt-get install mesa-vulkan-drivers gives Mesa's lavapipe)";
    }
    return "";
  }();
  return reason;
}

#define SKIP_WITHOUT_VULKAN()                             \
  do {                                                    \
    if (!SkipReason().empty()) GTEST_SKIP() << SkipReason(); \
  } while (0)

std::unique_ptr<RunnerProcess> Start(const std::string& program, const std::vector<std::string>& env) {
  RunnerProcess::Options options;
  options.command = {program};
  options.environment = env;
  auto runner = RunnerProcess::Start(options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? std::move(*runner) : nullptr;
}

runner_protocol::LoadRequest LoadOf(const std::string& model, int gpu_layers = -1) {
  runner_protocol::LoadRequest load{model, {}};
  load.options.n_parallel = 4;
  load.options.n_ctx_per_seq = 256;
  load.options.n_threads = 2;
  load.options.n_gpu_layers = gpu_layers;
  return load;
}

TEST(Vulkan, TheVulkanRunnerListsItsDeviceAndTheCpuRunnerNone) {
  SKIP_WITHOUT_VULKAN();
  auto devices = QueryRunnerDevices({VulkanRunner()}, kLavapipe);
  ASSERT_TRUE(devices.ok()) << devices.status();
  auto accelerator = AcceleratorFromDevices(*devices);
  ASSERT_TRUE(accelerator.has_value());
  EXPECT_EQ(accelerator->kind, "vulkan");
  EXPECT_FALSE(accelerator->name.empty());
  EXPECT_GT(accelerator->memory_bytes, 0);
  auto cpu = QueryRunnerDevices({TestProgram("minions-llama-runner")}, {});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE(AcceleratorFromDevices(*cpu).has_value());
}

TEST(Vulkan, EveryLayerIsOffloadedToTheDeviceAndNoneWithZeroGpuLayers) {
  SKIP_WITHOUT_VULKAN();
  auto runner = Start(VulkanRunner(), kLavapipe);
  ASSERT_TRUE(runner);
  auto info = runner->Load(LoadOf(TestModel("text.gguf")));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE((*info)["device"].get<std::string>().empty()) << info->dump();
  EXPECT_GT((*info)["layers"].get<int>(), 0) << info->dump();
  EXPECT_EQ((*info)["offloaded_layers"], (*info)["layers"]) << info->dump();
  ASSERT_TRUE((*info)["model_buffers"].contains("Vulkan0")) << info->dump();
  EXPECT_GT((*info)["model_buffers"]["Vulkan0"].get<int64_t>(), 0) << info->dump();
  auto out = RunRecords(*runner, "b", {R"({"custom_id":"a","prompt":"Hello","max_tokens":8,"temperature":0})"});
  EXPECT_EQ(out[0]["response"]["status_code"], 200) << out[0].dump();

  // n_gpu_layers 0: the weights stay on the CPU.
  auto cpu_only = Start(VulkanRunner(), kLavapipe);
  ASSERT_TRUE(cpu_only);
  auto kept = cpu_only->Load(LoadOf(TestModel("text.gguf"), 0));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)["offloaded_layers"], 0) << kept->dump();
  EXPECT_FALSE((*kept)["model_buffers"].contains("Vulkan0")) << kept->dump();
}

std::vector<std::string> GreedyRecords(int n, int max_tokens) {
  std::vector<std::string> records;
  for (int i = 0; i < n; ++i) {
    Json body = {{"prompt", absl::StrCat("Record ", i, ": the quick brown fox number ", i * 7, " jumps over")},
                 {"max_tokens", max_tokens},
                 {"temperature", 0}};
    records.push_back(
        DumpJson(Json{{"custom_id", absl::StrCat("r", i)}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}}));
  }
  return records;
}

std::string Text(const Json& line) { return line["response"]["body"]["choices"][0]["text"].get<std::string>(); }

// Greedy text on the Vulkan device against the CPU runner: how many records are the same text, and
// where the others first differ. The bound is docs/runner-protocol.md's ("Backends").
TEST(Vulkan, GreedyTextAgreesWithTheCpuRunnerWithinTheDocumentedBound) {
  SKIP_WITHOUT_VULKAN();
  constexpr int kRecords = 8, kTokens = 16;
  auto records = GreedyRecords(kRecords, kTokens);
  auto cpu = Start(TestProgram("minions-llama-runner"), {});
  auto gpu = Start(VulkanRunner(), kLavapipe);
  ASSERT_TRUE(cpu && gpu);
  ASSERT_TRUE(cpu->Load(LoadOf(TestModel("text.gguf"))).ok());
  ASSERT_TRUE(gpu->Load(LoadOf(TestModel("text.gguf"))).ok());
  auto on_cpu = RunRecords(*cpu, "b", records);
  auto on_gpu = RunRecords(*gpu, "b", records);
  int same = 0;
  size_t first_divergence = std::string::npos;  // in characters of generated text, over differing records
  for (int i = 0; i < kRecords; ++i) {
    ASSERT_EQ(on_cpu[i]["response"]["status_code"], 200) << on_cpu[i].dump();
    ASSERT_EQ(on_gpu[i]["response"]["status_code"], 200) << on_gpu[i].dump();
    std::string a = Text(on_cpu[i]), b = Text(on_gpu[i]);
    if (a == b) {
      ++same;
      continue;
    }
    size_t k = std::mismatch(a.begin(), a.begin() + std::min(a.size(), b.size()), b.begin()).first - a.begin();
    first_divergence = std::min(first_divergence, k);
  }
  // Printed for docs/runner-protocol.md and the issue: the measured agreement on this machine.
  printf("vulkan vs cpu, greedy: %d of %d records identical; earliest divergence at character %s\n", same,
         kRecords, first_divergence == std::string::npos ? "none" : std::to_string(first_divergence).c_str());
  // The bound: half the records (7 of 8 measured here, 26 of 32 with 32 records); other CPUs and
  // LLVM versions round lavapipe's kernels differently, hence the margin.
  EXPECT_GE(same * 2, kRecords) << "fewer than half the records gave the CPU's greedy text";
}

TEST(Vulkan, EmbeddingsAgreeWithTheCpuRunner) {
  SKIP_WITHOUT_VULKAN();
  std::vector<std::string> records;
  for (int i = 0; i < 8; ++i) {
    records.push_back(DumpJson(Json{{"custom_id", absl::StrCat("e", i)},
                                    {"url", "/v1/embeddings"},
                                    {"body", {{"input", absl::StrCat("sentence number ", i, " about foxes")}}}}));
  }
  auto cpu = Start(TestProgram("minions-llama-runner"), {});
  auto gpu = Start(VulkanRunner(), kLavapipe);
  ASSERT_TRUE(cpu && gpu);
  ASSERT_TRUE(cpu->Load(LoadOf(TestModel("embedding.gguf"))).ok());
  auto info = gpu->Load(LoadOf(TestModel("embedding.gguf")));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE((*info)["model_buffers"].contains("Vulkan0")) << info->dump();
  auto on_cpu = RunRecords(*cpu, "b", records);
  auto on_gpu = RunRecords(*gpu, "b", records);
  double worst = 1;
  for (size_t i = 0; i < records.size(); ++i) {
    auto a = on_cpu[i]["response"]["body"]["data"][0]["embedding"].get<std::vector<double>>();
    auto b = on_gpu[i]["response"]["body"]["data"][0]["embedding"].get<std::vector<double>>();
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    double dot = 0, na = 0, nb = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      dot += a[k] * b[k];
      na += a[k] * a[k];
      nb += b[k] * b[k];
    }
    worst = std::min(worst, dot / std::sqrt(na * nb));
  }
  printf("vulkan vs cpu, embeddings: worst cosine similarity %.6f\n", worst);
  EXPECT_GE(worst, 0.999);
}

// An executor started with the vulkan runner reports the accelerator, and a pool job runs there.
TEST(Vulkan, APoolJobRunsOnAVulkanExecutor) {
  SKIP_WITHOUT_VULKAN();
  std::string dir = (std::filesystem::temp_directory_path() / ("minions-vulkan-" + std::to_string(getpid()))).string();
  testing::ProcessPool pool(TestProgram("minions"), dir, 3000);
  pool.AllowModels({std::filesystem::path(TestModel("text.gguf")).parent_path().string()});
  ASSERT_TRUE(pool.StartServer().ok());
  // lavapipe compiles ggml's shaders on first use: minutes on a busy machine. The runner's Mesa
  // shader cache lives in its scratch folder (HOME), so it starts with the one the tests above
  // filled (they run the runner unconfined, with this process's HOME), and it may be silent
  // longer than the default hang limit while it compiles what is missing.
  if (const char* home = std::getenv("HOME")) {
    std::error_code ec;
    std::filesystem::create_directories(dir + "/vk/runner-scratch/.cache", ec);
    std::filesystem::copy(std::string(home) + "/.cache/mesa_shader_cache", dir + "/vk/runner-scratch/.cache/mesa_shader_cache",
                          std::filesystem::copy_options::recursive, ec);
  }
  ASSERT_TRUE(pool.StartExecutor("vk", 2, VulkanRunner(), "", {"--runner-hang-ms", "1800000"}, kLavapipe).ok());
  cli::JobsClient client(pool.connection());
  std::string input;
  for (const std::string& r : GreedyRecords(4, 4)) input += r + "\n";
  v1::SubmitJobRequest request;
  request.set_input(input);
  request.set_model(TestModel("text.gguf"));
  request.set_shard_size(2);
  auto job = client.Submit(request);
  ASSERT_TRUE(job.ok()) << job.status();
  v1::Job now;
  for (int i = 0; i < 6000; ++i) {  // 10 min: lavapipe compiles its shaders on first use
    auto got = client.Get(job->id());
    ASSERT_TRUE(got.ok()) << got.status();
    now = *got;
    if (now.state() == "completed" || now.state() == "failed" || now.state() == "cancelled") break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(now.state(), "completed") << now.error() << "; logs in " << dir << "/logs";
  auto executors = client.Executors();
  ASSERT_TRUE(executors.ok()) << executors.status();
  ASSERT_EQ(executors->size(), 1u);
  EXPECT_EQ((*executors)[0].accelerator(), "vulkan");
  EXPECT_FALSE((*executors)[0].gpu().empty());
  EXPECT_GT((*executors)[0].usable_memory_bytes(), 0);
  // The runner log shows the layers on the device (its `loaded` facts are the engine's).
  std::string results;
  ASSERT_TRUE(client.Results(job->id(), false, [&](const std::string& c) { results += c; }).ok());
  EXPECT_EQ(std::count(results.begin(), results.end(), '\n'), 4) << results;
  if (!HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minions
