// The real minions-llama-runner program driven through RunnerProcess: bad input of every kind
// gives its clear error, and nothing takes the runner down.

#include "runner/runner_process.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runner/batch_record.h"
#include "llama_runner_process.h"
#include "test_env.h"

namespace minions {
namespace {

using ::testing::HasSubstr;
using minions::testing::RunRecords;
using minions::testing::TestModel;

std::unique_ptr<RunnerProcess> StartRunner() { return testing::StartLlamaRunner(); }

runner_protocol::LoadRequest SmallLoad(const std::string& model) {
  runner_protocol::LoadRequest load{model, {}};
  load.options.n_parallel = 4;
  load.options.n_ctx_per_seq = 128;
  return load;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("minions-test-" + std::to_string(getpid()) + "-" + name)).string();
}

TEST(LlamaRunner, ServesGoodRecordsAndGivesEachBadOneItsError) {
  auto runner = StartRunner();
  ASSERT_TRUE(runner);
  auto info = runner->Load(SmallLoad(TestModel("text.gguf")));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ((*info)["architecture"], "llama");
  EXPECT_TRUE((*info)["has_chat_template"].get<bool>());

  std::string long_prompt;
  for (int i = 0; i < 400; ++i) long_prompt += "word ";
  std::vector<std::string> records = {
      R"({"custom_id":"ok-1","prompt":"Hello","max_tokens":4})",
      R"({"custom_id":"bad-json", "prompt": )",
      R"({"custom_id":"bad-url","url":"/v1/audio","body":{}})",
      R"({"custom_id":"no-body","url":"/v1/completions"})",
      R"({"custom_id":"empty","prompt":""})",
      DumpJson({{"custom_id", "too-long"}, {"prompt", long_prompt}}),
      R"({"custom_id":"too-many-tokens","prompt":"hi","max_tokens":100000})",
      R"({"custom_id":"bad-temp","prompt":"hi","temperature":"hot"})",
      R"(42)",
      R"({"custom_id":"ok-2","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3}})",
      R"({"custom_id":"ok-3","url":"/v1/embeddings","body":{"input":"embed me"}})",
  };
  Json done;
  auto out = RunRecords(*runner, "b1", records, &done);
  auto code = [&](size_t i) {
    Json error = OutputLineError(out[i]);
    return error.is_null() ? std::string("ok") : error["code"].get<std::string>();
  };
  auto message = [&](size_t i) { return OutputLineError(out[i]).value("message", std::string()); };
  EXPECT_EQ(code(0), "ok");
  EXPECT_EQ(out[0]["response"]["body"]["usage"]["completion_tokens"].get<int>() <= 4, true);
  EXPECT_EQ(code(1), "invalid_json");
  EXPECT_TRUE(out[1]["custom_id"].is_null());
  EXPECT_EQ(code(2), "unsupported_url");
  EXPECT_EQ(out[2]["custom_id"], "bad-url");
  EXPECT_EQ(code(3), "invalid_request");
  EXPECT_THAT(message(3), HasSubstr("missing body"));
  // A wrong request is answered as OpenAI's batch output has it: a 400 response, error null.
  EXPECT_EQ(out[3]["response"]["status_code"], 400);
  EXPECT_TRUE(out[3]["error"].is_null());
  EXPECT_EQ(out[3]["response"]["body"]["error"]["type"], "invalid_request_error");
  EXPECT_EQ(out[7]["response"]["body"]["error"]["param"], "body.temperature");
  EXPECT_EQ(code(4), "empty_prompt");
  EXPECT_EQ(code(5), "context_length_exceeded");
  EXPECT_THAT(message(5), HasSubstr("tokens per sequence"));
  EXPECT_EQ(code(6), "context_length_exceeded");
  EXPECT_THAT(message(6), HasSubstr("max_tokens"));
  EXPECT_EQ(code(7), "invalid_request");
  EXPECT_THAT(message(7), HasSubstr("temperature"));
  EXPECT_EQ(code(8), "invalid_request");
  EXPECT_EQ(code(9), "ok");
  EXPECT_EQ(out[9]["response"]["body"]["object"], "chat.completion");
  EXPECT_EQ(code(10), "ok");
  EXPECT_EQ(out[10]["response"]["body"]["data"][0]["embedding"].size(), 128u);
  EXPECT_EQ(done["records"], records.size());
  EXPECT_EQ(done["errors"], 8);
  EXPECT_FALSE(done["cancelled"].get<bool>());

  // Still serving after all that.
  auto again = RunRecords(*runner, "b2", {R"({"custom_id":"after","prompt":"Again","max_tokens":2})"});
  EXPECT_FALSE(IsErrorOutputLine(again[0]));
  EXPECT_EQ(runner->Shutdown().code, 0);
}

TEST(LlamaRunner, BadModelFilesAreClearErrorsAndTheRunnerLivesOn) {
  auto runner = StartRunner();
  ASSERT_TRUE(runner);

  auto missing = runner->Load(SmallLoad("/nonexistent/model.gguf"));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("does not exist"));

  std::string text_file = TempPath("not-a-model.gguf");
  std::ofstream(text_file) << "this is not a model\n";
  auto not_gguf = runner->Load(SmallLoad(text_file));
  EXPECT_THAT(std::string(not_gguf.status().message()), HasSubstr("not a GGUF file"));

  // The first 100 kB of a real model: a valid header, truncated tensors.
  std::string truncated = TempPath("truncated.gguf");
  {
    std::ifstream in(TestModel("text.gguf"), std::ios::binary);
    std::vector<char> head(100 * 1024);
    in.read(head.data(), head.size());
    std::ofstream(truncated, std::ios::binary).write(head.data(), in.gcount());
  }
  auto cut = runner->Load(SmallLoad(truncated));
  EXPECT_FALSE(cut.ok());
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("cannot load model"));

  std::string empty = TempPath("empty.gguf");
  std::ofstream(empty).close();
  EXPECT_FALSE(runner->Load(SmallLoad(empty)).ok());

  // Records sent with no model loaded are answered with an error each.
  auto out = RunRecords(*runner, "nomodel", {R"({"custom_id":"x","prompt":"hi"})"});
  EXPECT_THAT(OutputLineError(out[0])["message"].get<std::string>(), HasSubstr("no model is loaded"));

  // And a good model still loads afterwards.
  EXPECT_TRUE(runner->Load(SmallLoad(TestModel("text.gguf"))).ok());
  for (const auto& f : {text_file, truncated, empty}) std::filesystem::remove(f);
}

TEST(LlamaRunner, CancelStopsABatchAndAnswersEveryRecord) {
  auto runner = StartRunner();
  ASSERT_TRUE(runner);
  ASSERT_TRUE(runner->Load(SmallLoad(TestModel("text.gguf"))).ok());
  std::vector<std::string> records;
  for (int i = 0; i < 64; ++i) {
    records.push_back(DumpJson({{"custom_id", "r" + std::to_string(i)}, {"prompt", "Count: " + std::to_string(i)},
                                {"max_tokens", 100}, {"temperature", 0}}));
  }
  std::vector<Json> outputs(records.size());
  std::atomic<bool> cancel_sent{false};
  auto done = runner->RunBatch("big", records, [&](size_t i, const Json& line) {
    outputs[i] = line;
    if (!cancel_sent.exchange(true)) ASSERT_TRUE(runner->Cancel("big").ok());
  });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE((*done)["cancelled"].get<bool>());
  int cancelled = 0;
  for (const auto& line : outputs) {
    ASSERT_FALSE(line.is_null()) << "a record got no answer";
    cancelled += !line["error"].is_null() && OutputLineError(line)["code"] == "cancelled";
  }
  EXPECT_GT(cancelled, 32);
}

TEST(LlamaRunner, QueuedBatchesStreamThroughTheEngineAndOneCanBeCancelled) {
  // Three batches sent back to back share the decode slots; cancelling the middle one drops only
  // its records. Every record of every batch is answered once, and each batch gets one batch_done.
  auto runner = StartRunner();
  ASSERT_TRUE(runner);
  ASSERT_TRUE(runner->Load(SmallLoad(TestModel("text.gguf"))).ok());
  std::map<std::string, std::vector<int>> answered;
  std::map<std::string, Json> done;
  std::map<std::string, int> cancelled_lines;
  for (const std::string batch : {"a", "b", "c"}) {
    std::vector<std::string> records;
    for (int i = 0; i < 6; ++i) {
      records.push_back(DumpJson({{"custom_id", batch + std::to_string(i)}, {"prompt", "Stream " + batch},
                                  {"max_tokens", batch == "b" ? 100 : 6}, {"temperature", 0}}));
    }
    answered[batch].assign(records.size(), 0);
    ASSERT_TRUE(runner->StartBatch(batch, records).ok());
  }
  ASSERT_TRUE(runner->Cancel("b").ok());
  while (done.size() < 3) {
    auto event = runner->NextEvent(absl::Seconds(60));
    ASSERT_TRUE(event.ok()) << event.status();
    if (event->type == runner_protocol::Event::Type::kResult) {
      ++answered[event->batch][event->index];
      const Json& error = event->body["output"]["error"];
      cancelled_lines[event->batch] += !error.is_null() && error["code"] == "cancelled";
    } else if (event->type == runner_protocol::Event::Type::kBatchDone) {
      EXPECT_EQ(done.count(event->batch), 0u) << "two batch_done for " << event->batch;
      done[event->batch] = event->body;
    }
  }
  for (const auto& [batch, counts] : answered) {
    for (int c : counts) EXPECT_EQ(c, 1) << "batch " << batch;
  }
  EXPECT_FALSE(done["a"]["cancelled"].get<bool>());
  EXPECT_TRUE(done["b"]["cancelled"].get<bool>());
  EXPECT_FALSE(done["c"]["cancelled"].get<bool>());
  EXPECT_EQ(cancelled_lines["a"], 0);
  EXPECT_GT(cancelled_lines["b"], 0);
  EXPECT_EQ(cancelled_lines["c"], 0);
}

TEST(LlamaRunner, SharedPrefixesAreCountedInBatchDoneAndCanBeTurnedOff) {
  // Two batches of records with one long system prompt: with sharing (the default), the runner
  // reports the prompt tokens it reused, the second batch all of its prefixes; a load with
  // share_prefixes false reuses nothing. The outputs are the same.
  std::string system = "You answer questions about parcels, invoices and refunds. ";
  for (int i = 0; i < 12; ++i) system += "Rule " + std::to_string(i) + ": be precise, be brief and be kind. ";
  auto batch = [&](const std::string& name) {
    std::vector<std::string> records;
    for (int i = 0; i < 6; ++i) {
      records.push_back(DumpJson({{"custom_id", name + std::to_string(i)},
                                  {"url", "/v1/chat/completions"},
                                  {"body", {{"messages", {{{"role", "system"}, {"content", system}},
                                                          {{"role", "user"}, {"content", "Question " + std::to_string(i)}}}},
                                            {"max_tokens", 4}, {"temperature", 0}}}}));
    }
    return records;
  };
  std::map<bool, std::vector<Json>> outputs;
  for (bool share : {true, false}) {
    SCOPED_TRACE(share ? "sharing" : "not sharing");
    auto runner = StartRunner();
    ASSERT_TRUE(runner);
    auto load = SmallLoad(TestModel("text.gguf"));
    load.options.n_ctx_per_seq = 512;
    load.options.share_prefixes = share;
    ASSERT_TRUE(runner->Load(load).ok());
    Json first, second;
    auto a = RunRecords(*runner, "a", batch("a"), &first);
    auto b = RunRecords(*runner, "b", batch("b"), &second);
    const int64_t prompt = second["usage"]["prompt_tokens"].get<int64_t>();
    if (share) {
      EXPECT_GT(first["usage"]["cached_prompt_tokens"].get<int64_t>(), 0);
      // Every record of the second batch finds the system prompt in a slot.
      EXPECT_GT(second["usage"]["cached_prompt_tokens"].get<int64_t>(), prompt / 2);
    } else {
      EXPECT_EQ(first["usage"]["cached_prompt_tokens"], 0);
      EXPECT_EQ(second["usage"]["cached_prompt_tokens"], 0);
    }
    outputs[share] = a;
    outputs[share].insert(outputs[share].end(), b.begin(), b.end());
    EXPECT_EQ(runner->Shutdown().code, 0);
  }
  ASSERT_EQ(outputs[true].size(), outputs[false].size());
  for (size_t i = 0; i < outputs[true].size(); ++i) {
    EXPECT_EQ(outputs[true][i]["response"]["body"]["choices"], outputs[false][i]["response"]["body"]["choices"]) << i;
  }
}

TEST(LlamaRunner, ProtocolErrorsAnswerAndPingAndEofExitCleanly) {
  Subprocess::Options sp;
  sp.argv = {testing::TestProgram("minions-llama-runner")};
  auto process = Subprocess::Start(sp);
  ASSERT_TRUE(process.ok());
  auto ready = runner_protocol::DecodeEvent(*(*process)->ReadLine(absl::Seconds(30)));
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(ready->type, runner_protocol::Event::Type::kReady);
  ASSERT_TRUE((*process)->Write("this is not a command\n{\"op\":\"dance\"}\n").ok());
  for (const char* expected : {"not valid JSON", "unknown op"}) {
    auto event = runner_protocol::DecodeEvent(*(*process)->ReadLine(absl::Seconds(30)));
    ASSERT_TRUE(event.ok());
    EXPECT_EQ(event->type, runner_protocol::Event::Type::kError);
    EXPECT_THAT(event->message, HasSubstr(expected));
  }
  ASSERT_TRUE((*process)->Write(runner_protocol::EncodePing("p9")).ok());
  auto pong = runner_protocol::DecodeEvent(*(*process)->ReadLine(absl::Seconds(30)));
  EXPECT_EQ(pong->type, runner_protocol::Event::Type::kPong);
  EXPECT_EQ(pong->body["id"], "p9");
  (*process)->CloseStdin();
  auto exit = (*process)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->exited);
  EXPECT_EQ(exit->code, 0);
}

TEST(LlamaRunner, AProgramThatIsNotARunnerIsRejected) {
  RunnerProcess::Options options;
  options.command = {"echo", "hello"};
  auto runner = RunnerProcess::Start(options);
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr("does not speak the runner protocol"));
}

}  // namespace
}  // namespace minions
