#include "model/json_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(JobSpecJson, RoundTrip) {
  JobSpec spec;
  spec.team = "search";
  spec.model = "/models/qwen.gguf";
  spec.input_key = "inputs/abc.jsonl";
  spec.shard_size = 250;
  spec.max_attempts = 6;
  spec.priority = -2;
  spec.requirements.min_memory_bytes = int64_t{16} << 30;
  spec.requirements.runner = "mlx";
  spec.runner_options = Json{{"n_parallel", 4}, {"flash_attn", false}};
  spec.completion_window = absl::Hours(24);

  Json json = JobSpecToJson(spec);
  EXPECT_EQ(json["completion_window"], "24h");
  absl::StatusOr<JobSpec> back = JobSpecFromJson(ParseJson(DumpJson(json)).value());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->team, "search");
  EXPECT_EQ(back->model, spec.model);
  EXPECT_EQ(back->input_key, spec.input_key);
  EXPECT_EQ(back->shard_size, 250);
  EXPECT_EQ(back->max_attempts, 6);
  EXPECT_EQ(back->priority, -2);
  EXPECT_EQ(back->requirements.min_memory_bytes, int64_t{16} << 30);
  EXPECT_EQ(back->requirements.runner, "mlx");
  EXPECT_EQ(back->runner_options, spec.runner_options);
  EXPECT_EQ(back->completion_window, absl::Hours(24));
}

TEST(JobSpecJson, MissingFieldsTakeDefaults) {
  absl::StatusOr<JobSpec> spec = JobSpecFromJson(Json::object());
  ASSERT_TRUE(spec.ok());
  JobSpec defaults;
  EXPECT_EQ(spec->team, defaults.team);
  EXPECT_EQ(spec->shard_size, defaults.shard_size);
  EXPECT_EQ(spec->max_attempts, defaults.max_attempts);
  EXPECT_EQ(spec->requirements.runner, "llama");
  EXPECT_EQ(spec->runner_options, Json::object());
  EXPECT_EQ(spec->completion_window, std::nullopt);
  EXPECT_FALSE(JobSpecToJson(defaults).contains("completion_window"));
}

TEST(JobSpecJson, CompletionWindowInSeconds) {
  absl::StatusOr<JobSpec> spec = JobSpecFromJson(Json{{"completion_window", 90}});
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->completion_window, absl::Seconds(90));
}

TEST(JobSpecJson, WrongTypesNameTheField) {
  struct Case {
    Json json;
    const char* field;
  };
  const Case cases[] = {
      {Json{{"team", 3}}, "team"},
      {Json{{"shard_size", "100"}}, "shard_size"},
      {Json{{"priority", 1.5}}, "priority"},
      {Json{{"requirements", {{"runner", false}}}}, "runner"},
      {Json{{"requirements", "big"}}, "requirements"},
      {Json{{"runner_options", Json::array()}}, "runner_options"},
      {Json{{"completion_window", "soon"}}, "completion_window"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<JobSpec> spec = JobSpecFromJson(c.json);
    ASSERT_FALSE(spec.ok()) << c.json;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.field));
  }
  EXPECT_FALSE(JobSpecFromJson(Json::array()).ok());
}

TEST(ExecutorInfoJson, RoundTrip) {
  ExecutorInfo info;
  info.name = "mac-17";
  info.os = "macos";
  info.chip = "Apple M2 Max";
  info.memory_bytes = int64_t{64} << 30;
  info.gpu = "Apple M2 Max";
  info.runners = {"llama", "mlx"};
  info.models = {"/m/a.gguf"};
  info.max_tasks = 2;
  info.version = "0.1.0";
  absl::StatusOr<ExecutorInfo> back = ExecutorInfoFromJson(ParseJson(DumpJson(ExecutorInfoToJson(info))).value());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, "mac-17");
  EXPECT_EQ(back->os, "macos");
  EXPECT_EQ(back->chip, info.chip);
  EXPECT_EQ(back->memory_bytes, info.memory_bytes);
  EXPECT_EQ(back->gpu, info.gpu);
  EXPECT_THAT(back->runners, ElementsAre("llama", "mlx"));
  EXPECT_THAT(back->models, ElementsAre("/m/a.gguf"));
  EXPECT_EQ(back->max_tasks, 2);
  EXPECT_EQ(back->version, "0.1.0");

  absl::StatusOr<ExecutorInfo> bad = ExecutorInfoFromJson(Json{{"runners", {"llama", 3}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("runners"));
}

}  // namespace
}  // namespace minions
