// The accelerator an executor reports, from the devices its runner's llama.cpp lists
// (executor/runner_devices.h): the device lists of Metal, CUDA and Vulkan machines as
// `minions-llama-runner --devices` prints them, bad output refused, and the query itself against
// small stand-in programs.

#include "executor/runner_devices.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace minions {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

std::vector<RunnerDevice> Parse(const std::string& json) {
  auto devices = ParseRunnerDevices(json);
  EXPECT_TRUE(devices.ok()) << devices.status();
  return devices.ok() ? *devices : std::vector<RunnerDevice>{};
}

// `a` is the accelerator `want`: its kind, name, memory and whether it shares the machine's.
void ExpectAccelerator(const std::optional<Accelerator>& a, const Accelerator& want) {
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->kind, want.kind);
  EXPECT_EQ(a->name, want.name);
  EXPECT_EQ(a->memory_bytes, want.memory_bytes);
  EXPECT_EQ(a->unified, want.unified);
}

TEST(RunnerDevices, MetalIsUnifiedMemory) {
  // An Apple M2 Max: Metal (recommended working set), BLAS (beside the CPU, not an accelerator), CPU.
  auto devices = Parse(R"json({"devices":[
    {"name":"MTL0","description":"Apple M2 Max","type":"gpu","backend":"MTL","memory_total":77309411328,"memory_free":77309411328},
    {"name":"BLAS","description":"Accelerate","type":"accel","backend":"BLAS","memory_total":0,"memory_free":0},
    {"name":"CPU","description":"Apple M2 Max","type":"cpu","backend":"CPU","memory_total":103079215104,"memory_free":0}]})json");
  auto a = AcceleratorFromDevices(devices);
  ASSERT_NO_FATAL_FAILURE(ExpectAccelerator(a, {"metal", "Apple M2 Max", 77309411328, /*unified=*/true}));
  // Unified: never more than the machine's memory, times the owner's share.
  EXPECT_EQ(UsableMemoryBytes(*a, 64 * kGiB, 0.5), 32 * kGiB);
}

TEST(RunnerDevices, TwoCudaGpusAddUpTheirOwnMemory) {
  auto devices = Parse(R"json({"devices":[
    {"name":"CUDA0","description":"NVIDIA GeForce RTX 4090","type":"gpu","backend":"CUDA","memory_total":25769803776,"memory_free":25000000000},
    {"name":"CUDA1","description":"NVIDIA GeForce RTX 4090","type":"gpu","backend":"CUDA","memory_total":25769803776,"memory_free":25000000000},
    {"name":"CPU","description":"AMD Ryzen 9 7950X","type":"cpu","backend":"CPU","memory_total":16000000000,"memory_free":0}]})json");
  auto a = AcceleratorFromDevices(devices);
  ASSERT_NO_FATAL_FAILURE(ExpectAccelerator(a, {"cuda", "NVIDIA GeForce RTX 4090 x2", 48 * kGiB, /*unified=*/false}));
  // Discrete memory is not capped by the machine's (16 GB here).
  EXPECT_EQ(UsableMemoryBytes(*a, 16 * kGiB, 1.0), 48 * kGiB);
}

TEST(RunnerDevices, VulkanDevices) {
  // Mesa's lavapipe (a Vulkan device on the CPU; GGML_VK_VISIBLE_DEVICES=0 makes ggml use it).
  auto lavapipe = AcceleratorFromDevices(Parse(R"json({"devices":[
    {"name":"Vulkan0","description":"llvmpipe (LLVM 15.0.6, 256 bits)","type":"gpu","backend":"Vulkan","memory_total":8589934592,"memory_free":8589934592},
    {"name":"CPU","description":"Intel Xeon","type":"cpu","backend":"CPU","memory_total":8589934592,"memory_free":0}]})json"));
  ExpectAccelerator(lavapipe, {"vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)", 8 * kGiB, /*unified=*/false});
  // An Intel laptop's integrated GPU: shares the machine's memory.
  auto integrated = AcceleratorFromDevices(Parse(R"json({"devices":[
    {"name":"Vulkan0","description":"Intel(R) Iris(R) Xe Graphics","type":"igpu","backend":"Vulkan","memory_total":17179869184,"memory_free":1},
    {"name":"CPU","description":"Intel Core i7","type":"cpu","backend":"CPU","memory_total":1,"memory_free":0}]})json"));
  ASSERT_TRUE(integrated.has_value());
  EXPECT_EQ(integrated->kind, "vulkan");
  EXPECT_TRUE(integrated->unified);
  EXPECT_EQ(UsableMemoryBytes(*integrated, 8 * kGiB, 1.0), 8 * kGiB);
  // A build with two GPU backends: the first backend's devices make the accelerator.
  auto mixed = AcceleratorFromDevices(Parse(R"json({"devices":[
    {"name":"CUDA0","description":"NVIDIA A100","type":"gpu","backend":"CUDA","memory_total":1000,"memory_free":1},
    {"name":"Vulkan0","description":"NVIDIA A100","type":"gpu","backend":"Vulkan","memory_total":1000,"memory_free":1}]})json"));
  ExpectAccelerator(mixed, {"cuda", "NVIDIA A100", 1000, /*unified=*/false});
}

TEST(RunnerDevices, CpuOnlyHasNoAccelerator) {
  EXPECT_FALSE(AcceleratorFromDevices(Parse(R"json({"devices":[
    {"name":"CPU","description":"Intel Xeon","type":"cpu","backend":"CPU","memory_total":1,"memory_free":0}]})json")));
  EXPECT_FALSE(AcceleratorFromDevices(Parse(R"json({"devices":[]})json")));
  EXPECT_EQ(AcceleratorKind("ROCm"), "rocm");
  EXPECT_EQ(AcceleratorKind("SYCL"), "sycl");
}

TEST(RunnerDevices, CapabilitiesReportTheRunnersAccelerator) {
  CapabilityOptions options;
  options.name = "box";
  options.accelerator = AcceleratorFromDevices(Parse(R"json({"devices":[
    {"name":"Vulkan0","description":"AMD Radeon RX 7900 XTX (RADV NAVI31)","type":"gpu","backend":"Vulkan","memory_total":25769803776,"memory_free":1}]})json"));
  options.owner_memory_share = 0.5;
  v1::Capabilities c = DetectCapabilities(options);
  EXPECT_EQ(c.accelerator(), "vulkan");
  EXPECT_EQ(c.gpu(), "AMD Radeon RX 7900 XTX (RADV NAVI31)");
  EXPECT_EQ(c.usable_memory_bytes(), 12 * kGiB);
}

TEST(RunnerDevices, RefusesWhatIsNotADeviceList) {
  for (const char* bad : {"", "not json", "[]", R"json({"devices":3})json", R"json({"devices":[1]})json",
                          R"json({"devices":[{"description":"no name","type":"gpu"}]})json",
                          R"json({"devices":[{"name":"x"}]})json"}) {
    auto devices = ParseRunnerDevices(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(devices.status())) << bad << ": " << devices.status();
  }
  std::string many = R"({"devices":[)";
  for (int i = 0; i < 300; ++i) many += absl::StrCat(i ? "," : "", R"({"name":"d","type":"gpu"})");
  many += "]}";
  EXPECT_NE(ParseRunnerDevices(many).status().message().find("more than 256"), std::string::npos);
  // Negative memory from a confused runner counts as unknown, not as a negative size.
  auto negative = Parse(R"json({"devices":[{"name":"Vulkan0","type":"gpu","backend":"Vulkan","memory_total":-5}]})json");
  ASSERT_EQ(negative.size(), 1u);
  EXPECT_EQ(negative[0].memory_total, 0);
}

// Stand-in runner programs: shell scripts.
std::string Script(const std::string& name, const std::string& body) {
  std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(), "/minions-devices-", getpid());
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + name;
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  chmod(path.c_str(), 0700);
  return path;
}

TEST(RunnerDevices, QueriesTheRunnerProgram) {
  // The argument and the environment reach the program.
  std::string lister = Script("lister", R"([ "$1" = --devices ] || exit 3
echo '{"devices":[{"name":"Vulkan0","description":"'"$GPU_NAME"'","type":"gpu","backend":"Vulkan","memory_total":42}]}')");
  auto devices = QueryRunnerDevices({lister}, {"GPU_NAME=fake gpu"});
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 1u);
  EXPECT_EQ((*devices)[0].description, "fake gpu");
  EXPECT_EQ((*devices)[0].memory_total, 42);

  // A runner that does not know the flag: an error, never a crash or a hang.
  auto failing = QueryRunnerDevices({Script("unknown", "echo 'error: unknown argument' >&2; exit 2")}, {});
  EXPECT_TRUE(absl::IsFailedPrecondition(failing.status())) << failing.status();
  // One that speaks the protocol instead (reads stdin, which is closed at once).
  auto protocol = QueryRunnerDevices({Script("protocol", "echo '{\"event\":\"ready\"}'; cat >/dev/null")}, {});
  EXPECT_TRUE(absl::IsInvalidArgument(protocol.status())) << protocol.status();
  // One that never answers is given up.
  auto hung = QueryRunnerDevices({Script("hung", "exec sleep 600")}, {}, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(hung.status())) << hung.status();
  auto missing = QueryRunnerDevices({"/nonexistent/minions-llama-runner"}, {});
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace minions
