#include "runner/llama/test_model_writer.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "test_env.h"

namespace minions::llama_runner {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TestModelWriter : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("minions-model-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    vocab_ = minions::testing::VocabDir() + "/ggml-vocab-llama-spm.gguf";
  }
  void TearDown() override { fs::remove_all(dir_); }
  TestModelSpec Spec(uint64_t seed) {
    TestModelSpec spec;
    spec.seed = seed;
    spec.vocab_path = vocab_;
    spec.n_layer = 1;
    return spec;
  }
  fs::path dir_;
  std::string vocab_;
};

TEST_F(TestModelWriter, SameSeedSameBytesOtherSeedOtherBytes) {
  ASSERT_TRUE(WriteTestModel(Spec(1), (dir_ / "a.gguf").string()).ok());
  ASSERT_TRUE(WriteTestModel(Spec(1), (dir_ / "b.gguf").string()).ok());
  ASSERT_TRUE(WriteTestModel(Spec(2), (dir_ / "c.gguf").string()).ok());
  std::string a = Slurp((dir_ / "a.gguf").string());
  EXPECT_GT(a.size(), 1000000u);
  EXPECT_EQ(a.substr(0, 4), "GGUF");
  EXPECT_EQ(a, Slurp((dir_ / "b.gguf").string()));
  EXPECT_NE(a, Slurp((dir_ / "c.gguf").string()));
}

TEST_F(TestModelWriter, MissingVocabIsAClearErrorAndLeavesNoFile) {
  TestModelSpec spec = Spec(1);
  spec.vocab_path = (dir_ / "no-such-vocab.gguf").string();
  auto status = WriteTestModel(spec, (dir_ / "m.gguf").string());
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_FALSE(fs::exists(dir_ / "m.gguf"));
  EXPECT_FALSE(fs::exists(dir_ / "m.gguf.tmp"));
}

}  // namespace
}  // namespace minions::llama_runner
