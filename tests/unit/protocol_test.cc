#include "runner/protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace minions::runner_protocol {
namespace {

using ::testing::HasSubstr;

TEST(RunnerProtocol, CommandsRoundTrip) {
  LoadRequest load{"/m.gguf", {}};
  load.options.n_parallel = 3;
  auto decoded = DecodeCommand(EncodeLoad(load));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->op, Command::Op::kLoad);
  EXPECT_EQ(decoded->load.model, "/m.gguf");
  EXPECT_EQ(decoded->load.options.n_parallel, 3);
  EXPECT_TRUE(decoded->load.options.share_prefixes);
  load.options.share_prefixes = false;
  EXPECT_FALSE(DecodeCommand(EncodeLoad(load))->load.options.share_prefixes);

  auto run = DecodeCommand(EncodeRun({"b7", {"{\"custom_id\":\"a\"}", "not json"}}));
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->run.batch, "b7");
  EXPECT_EQ(run->run.records.size(), 2u);
  EXPECT_EQ(run->run.records[1], "not json");

  EXPECT_EQ(DecodeCommand(EncodeCancel("b7"))->id, "b7");
  EXPECT_EQ(DecodeCommand(EncodePing("p1"))->op, Command::Op::kPing);
  EXPECT_EQ(DecodeCommand(EncodeShutdown())->op, Command::Op::kShutdown);
}

TEST(RunnerProtocol, RecordsGivenAsObjectsAreAccepted) {
  auto run = DecodeCommand(R"({"op":"run","batch":"b","records":[{"custom_id":"a","prompt":"p"}]})");
  ASSERT_TRUE(run.ok());
  EXPECT_THAT(run->run.records[0], HasSubstr("\"custom_id\":\"a\""));
}

TEST(RunnerProtocol, BadCommandsSayWhatIsWrong) {
  EXPECT_THAT(std::string(DecodeCommand("nope").status().message()), HasSubstr("not valid JSON"));
  EXPECT_THAT(std::string(DecodeCommand(R"({"op":"fly"})").status().message()), HasSubstr("unknown op"));
  EXPECT_THAT(std::string(DecodeCommand(R"({"op":"load"})").status().message()), HasSubstr("GGUF"));
  EXPECT_THAT(std::string(DecodeCommand(R"({"op":"run","batch":"b"})").status().message()),
              HasSubstr("records"));
  EXPECT_THAT(std::string(DecodeCommand(R"({"op":"load","model":"m","options":{"n_parallel":0}})").status().message()),
              HasSubstr("n_parallel"));
  EXPECT_THAT(std::string(DecodeCommand(R"({"op":"load","model":"m","options":{"share_prefixes":"yes"}})")
                              .status()
                              .message()),
              HasSubstr("share_prefixes must be true or false"));
}

TEST(RunnerProtocol, AGangRoundTripsAndIsAbsentWithoutOne) {
  LoadRequest load{"/m.gguf", {}};
  EXPECT_EQ(EncodeLoad(load).find("gang"), std::string::npos);
  load.gang.leader_bytes = 1000;
  load.gang.servers = {{"10.0.0.2:50052", 2000}, {"[fe80::1]:7000", 0}};
  auto decoded = DecodeCommand(EncodeLoad(load));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->load.gang, load.gang);
  EXPECT_TRUE(DecodeCommand(R"({"op":"load","model":"m"})")->load.gang.servers.empty());
}

TEST(RunnerProtocol, BadGangsSayWhatIsWrong) {
  auto message = [](const std::string& gang) {
    return std::string(DecodeCommand(R"({"op":"load","model":"m","gang":)" + gang + "}").status().message());
  };
  EXPECT_THAT(message(R"("10.0.0.2:1")"), HasSubstr("must be an object"));
  EXPECT_THAT(message(R"({})"), HasSubstr("needs \"servers\""));
  EXPECT_THAT(message(R"({"servers":[]})"), HasSubstr("1 to 16"));
  EXPECT_THAT(message(R"({"servers":[{"endpoint":"10.0.0.2"}]})"), HasSubstr("host:port"));
  EXPECT_THAT(message(R"({"servers":[{"endpoint":":50052"}]})"), HasSubstr("host:port"));
  EXPECT_THAT(message(R"({"servers":[{"endpoint":"10.0.0.2:0"}]})"), HasSubstr("host:port"));
  EXPECT_THAT(message(R"({"servers":[{"endpoint":"10.0.0.2:70000"}]})"), HasSubstr("host:port"));
  EXPECT_THAT(message(R"({"servers":[{"endpoint":"a b:1"}]})"), HasSubstr("host:port"));
  EXPECT_THAT(message(R"({"servers":[{"endpoint":"h:1","bytes":-1}]})"), HasSubstr("non-negative"));
  EXPECT_THAT(message(R"({"servers":[{"endpoint":"h:1"},{"endpoint":"h:1"}]})"), HasSubstr("named twice"));
  EXPECT_THAT(message(R"({"leader_bytes":"lots","servers":[{"endpoint":"h:1"}]})"), HasSubstr("leader_bytes"));
  Json many = Json::array();
  for (int i = 0; i < 17; ++i) many.push_back({{"endpoint", "h:" + std::to_string(i + 1)}});
  EXPECT_THAT(message(DumpJson({{"servers", many}})), HasSubstr("1 to 16"));
}

TEST(RunnerProtocol, AJobsRunnerOptionsCannotNameAGang) {
  // The rpc endpoints come from the lease only: a "gang" among a job's options is not read.
  // A job's runner_options become load's "options"; a gang there is not a gang.
  auto load = DecodeCommand(R"({"op":"load","model":"m","options":{"gang":{"servers":[{"endpoint":"evil:1"}]}}})");
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_TRUE(load->load.gang.servers.empty());
  EXPECT_FALSE(load->load.options.ToJson().contains("gang"));
}

TEST(RunnerProtocol, LoadOptionsWithoutSharePrefixesKeepTheDefault) {
  // An executor that predates the option sends none: prefixes are shared.
  auto load = DecodeCommand(R"({"op":"load","model":"m","options":{"n_parallel":2}})");
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_TRUE(load->load.options.share_prefixes);
}

TEST(RunnerProtocol, EventsRoundTrip) {
  auto ready = DecodeEvent(EncodeReady("r", "1.0"));
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(ready->type, Event::Type::kReady);
  EXPECT_EQ(ready->body["protocol"], kProtocolVersion);

  auto result = DecodeEvent(EncodeResult("b", 4, Json{{"custom_id", "x"}}));
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->type, Event::Type::kResult);
  EXPECT_EQ(result->batch, "b");
  EXPECT_EQ(result->index, 4u);
  EXPECT_EQ(result->body["output"]["custom_id"], "x");

  BatchStats stats;
  stats.records = 5;
  stats.cancelled = true;
  stats.cached_prompt_tokens = 1200;
  auto done = DecodeEvent(EncodeBatchDone("b", stats));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->type, Event::Type::kBatchDone);
  EXPECT_EQ(done->body["records"], 5);
  EXPECT_TRUE(done->body["cancelled"].get<bool>());
  EXPECT_EQ(done->body["usage"]["cached_prompt_tokens"], 1200);

  auto error = DecodeEvent(EncodeError("load", "", "boom"));
  EXPECT_EQ(error->type, Event::Type::kError);
  EXPECT_EQ(error->message, "boom");
  EXPECT_FALSE(DecodeEvent(R"({"type":"result","batch":"b"})").ok());
  EXPECT_FALSE(DecodeEvent("garbage").ok());
}

// A job's runner options are capped: the KV cache grows with n_parallel x n_ctx_per_seq, and the
// machine is someone's laptop.
TEST(LoadOptions, RunnerOptionsAreCapped) {
  auto refused = [](const char* json) {
    auto options = LoadOptions::FromJson(Json::parse(json));
    return options.ok() ? std::string("accepted") : std::string(options.status().message());
  };
  EXPECT_THAT(refused(R"({"n_parallel": 65})"), HasSubstr("n_parallel must be an integer in [1, 64]"));
  EXPECT_THAT(refused(R"({"n_ctx_per_seq": 131073})"), HasSubstr("n_ctx_per_seq must be an integer in [0, 131072]"));
  EXPECT_THAT(refused(R"({"n_parallel": 64, "n_ctx_per_seq": 8192})"), HasSubstr("524288 tokens of context; at most 262144"));
  EXPECT_THAT(refused(R"({"n_parallel": 65, "n_ctx_per_seq": 0})"), HasSubstr("n_parallel"));
  EXPECT_THAT(refused(R"({"n_batch": 8193})"), HasSubstr("n_batch"));
  EXPECT_THAT(refused(R"({"default_max_tokens": 1000000})"), HasSubstr("default_max_tokens"));
  EXPECT_EQ(refused(R"({"n_parallel": 64, "n_ctx_per_seq": 4096})"), "accepted");
  EXPECT_EQ(refused(R"({"n_parallel": 64})"), "accepted");  // 64 x 4096
  EXPECT_EQ(refused(R"({"n_parallel": 2, "n_ctx_per_seq": 131072})"), "accepted");
  // The runner refuses the same in a load command.
  EXPECT_FALSE(DecodeCommand(R"({"op":"load","model":"m","options":{"n_parallel":64,"n_ctx_per_seq":8192}})").ok());
}

}  // namespace
}  // namespace minions::runner_protocol
