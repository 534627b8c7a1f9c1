// The OpenAI API's HTTP layer on a real loopback port (SQLite in memory, a local object store, real
// tokens): every refusal in OpenAI's error shape, and nothing a hostile request sends crashes the
// server or leaves anything behind.

#include "openai/openai_api.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "blob/local/local_blob_store.h"
#include "identity/identity_admin.h"
#include "server/keys.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/fake_clock.h"
#include "testing/identities.h"
#include "testing/must.h"
#include "testing/openai_stack.h"

namespace minions::openai {
namespace {

using ::minions::testing::CreateTeams;
using ::minions::testing::IssueText;
using ::minions::testing::Must;
using ::testing::HasSubstr;

struct Reply {
  int status = 0;
  std::string body;
  Json json;  // the body, parsed (null when it is not JSON)
};

// One request over a fresh connection, written as given; reads until the server closes.
Reply Raw(int port, const std::string& bytes) {
  Reply reply;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return reply;
  }
  for (size_t sent = 0; sent < bytes.size();) {
    ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer (and close) before the body has all gone
    sent += static_cast<size_t>(n);
  }
  std::string all;
  char buffer[65536];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) all.append(buffer, static_cast<size_t>(n));
  close(fd);
  if (all.size() < 12) return reply;
  reply.status = std::atoi(all.substr(9, 3).c_str());
  size_t end = all.find("\r\n\r\n");
  reply.body = end == std::string::npos ? "" : all.substr(end + 4);
  auto parsed = ParseJson(reply.body);
  if (parsed.ok()) reply.json = *parsed;
  return reply;
}

std::string Request(const std::string& method, const std::string& path, const std::string& token,
                    const std::string& body = "", const std::string& content_type = "application/json",
                    const std::string& extra_headers = "") {
  std::string out = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: test\r\n");
  if (!token.empty()) absl::StrAppend(&out, "Authorization: Bearer ", token, "\r\n");
  if (!body.empty() || method == "POST") {
    absl::StrAppend(&out, "Content-Type: ", content_type, "\r\nContent-Length: ", body.size(), "\r\n");
  }
  absl::StrAppend(&out, extra_headers, "\r\n", body);
  return out;
}

std::string Form(const std::string& file, const std::string& purpose = "batch", const std::string& boundary = "XyZ") {
  return absl::StrCat("--", boundary, "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"input.jsonl\"\r\n",
                      "Content-Type: application/jsonl\r\n\r\n", file, "\r\n--", boundary,
                      "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n", purpose, "\r\n--", boundary,
                      "--\r\n");
}
constexpr char kFormType[] = "multipart/form-data; boundary=XyZ";

std::string Line(const std::string& id, const std::string& model = "tiny",
                 const std::string& url = "/v1/chat/completions") {
  return DumpJson(Json{{"custom_id", id},
                       {"method", "POST"},
                       {"url", url},
                       {"body", {{"model", model}, {"messages", {{{"role", "user"}, {"content", "hi " + id}}}}}}});
}

// An error in OpenAI's shape, with this status.
void ExpectError(const Reply& reply, int status, const std::string& says = "") {
  EXPECT_EQ(reply.status, status) << reply.body;
  ASSERT_TRUE(reply.json.is_object()) << reply.body;
  ASSERT_TRUE(reply.json.contains("error")) << reply.body;
  const Json& error = reply.json["error"];
  EXPECT_TRUE(error["message"].is_string());
  EXPECT_TRUE(error["type"].is_string());
  EXPECT_TRUE(error.contains("param"));
  EXPECT_TRUE(error.contains("code"));
  if (!says.empty()) EXPECT_THAT(error["message"].get<std::string>(), HasSubstr(says));
}

class OpenAiApiTest : public ::minions::testing::OpenAiStack {
 protected:
  void SetUp() override {
    SetUpStack("minions-openai",
               {{"tiny.gguf", "not really a model; nothing runs it here"}, {"other.gguf", "nor this"}});
    submitter_ = Issue(Role::kSubmitter, "search", "alice");
    viewer_ = Issue(Role::kViewer, "search", "vera");
    other_team_ = Issue(Role::kSubmitter, "ads", "bob");
    OpenAiApiOptions options;
    options.max_file_bytes = 64 << 10;
    api_ = std::make_unique<OpenAiApi>(
        OpenAiApi::Deps{store_.get(), blobs_.get(), &clock_, auth_.get(), jobs_.get(), catalog_.get(), {}}, options);
    HttpServerOptions http_options;
    http_options.request_timeout = absl::Seconds(5);
    http_ = std::make_unique<HttpServer>(http_options);
    api_->Install(http_.get());
    ASSERT_TRUE(http_->Start("127.0.0.1:0").ok());
    port_ = http_->port();
  }
  void TearDown() override {
    http_->Stop();
    std::filesystem::remove_all(dir_);
  }

  std::string Issue(Role role, const std::string& team, const std::string& name) {
    return IssueText(*identities_, role, team, name);
  }

  Reply Send(const std::string& method, const std::string& path, const std::string& token,
             const std::string& body = "", const std::string& content_type = "application/json",
             const std::string& extra_headers = "") {
    return Raw(port_, Request(method, path, token, body, content_type, extra_headers));
  }
  // Uploads `lines` as a batch file; its id.
  std::string Upload(const std::vector<std::string>& lines, const std::string& token = "") {
    std::string file;
    for (const auto& l : lines) file += l + "\n";
    Reply reply = Send("POST", "/v1/files", token.empty() ? submitter_ : token, Form(file), kFormType);
    EXPECT_EQ(reply.status, 200) << reply.body;
    EXPECT_EQ(reply.json["bytes"], file.size());
    return reply.json.value("id", "");
  }
  Reply CreateBatch(const std::string& file_id, const std::string& extra_headers = "",
                    const std::string& window = "24h") {
    return Send("POST", "/v1/batches", submitter_,
                DumpJson(Json{{"input_file_id", file_id},
                              {"endpoint", "/v1/chat/completions"},
                              {"completion_window", window},
                              {"metadata", {{"purpose", "test"}}}}),
                "application/json", extra_headers);
  }
  // The object keys under `prefix`.
  std::vector<std::string> Objects(const std::string& prefix) { return Must(blobs_->List(prefix)); }

  std::unique_ptr<OpenAiApi> api_;
  std::unique_ptr<HttpServer> http_;
  int port_ = 0;
  std::string submitter_, viewer_, other_team_;
};

TEST_F(OpenAiApiTest, UnknownRoutesAndMethodsGetOpenAiErrors) {
  ExpectError(Send("GET", "/v1/nothing", submitter_), 404, "Unknown request URL");
  ExpectError(Send("GET", "/v1/files/a/b/c", submitter_), 404);
  ExpectError(Send("DELETE", "/v1/batches", submitter_), 405);
  ExpectError(Send("POST", "/v1/models", submitter_, "{}"), 405);
  EXPECT_EQ(Send("PUT", "/v1/files", submitter_).status, 405);  // refused before routing, in plain text
}

TEST_F(OpenAiApiTest, AMissingOrWrongKeyIs401) {
  Reply none = Send("GET", "/v1/batches", "");
  ExpectError(none, 401, "API key");
  Reply wrong = Send("GET", "/v1/batches", "mn_sub_not-a-real-token");
  ExpectError(wrong, 401);
  EXPECT_EQ(wrong.json["error"]["code"], "invalid_api_key");
  ExpectError(Send("POST", "/v1/files", "garbage", Form("{}\n"), kFormType), 401);
  EXPECT_TRUE(Objects("openai/").empty());
}

TEST_F(OpenAiApiTest, AViewerReadsButCannotCreate) {
  std::string id = Upload({Line("a")});
  EXPECT_EQ(Send("GET", "/v1/files/" + id, viewer_).status, 200);
  EXPECT_EQ(Send("GET", "/v1/batches", viewer_).status, 200);
  ExpectError(Send("POST", "/v1/files", viewer_, Form(Line("b") + "\n"), kFormType), 403);
  ExpectError(Send("POST", "/v1/batches", viewer_,
                   DumpJson(Json{{"input_file_id", id}, {"endpoint", "/v1/chat/completions"},
                                 {"completion_window", "24h"}})),
              403);
  ExpectError(Send("DELETE", "/v1/files/" + id, viewer_), 403);
}

TEST_F(OpenAiApiTest, FilesUploadListRetrieveDownloadDelete) {
  std::string file = Line("a") + "\n" + Line("b") + "\n";
  Reply up = Send("POST", "/v1/files", submitter_, Form(file), kFormType);
  ASSERT_EQ(up.status, 200) << up.body;
  const std::string id = up.json["id"];
  EXPECT_EQ(up.json["object"], "file");
  EXPECT_EQ(up.json["purpose"], "batch");
  EXPECT_EQ(up.json["filename"], "input.jsonl");
  EXPECT_EQ(up.json["bytes"], file.size());
  Reply got = Send("GET", "/v1/files/" + id, submitter_);
  EXPECT_EQ(got.json, up.json);
  Reply content = Send("GET", "/v1/files/" + id + "/content", submitter_);
  EXPECT_EQ(content.status, 200);
  EXPECT_EQ(content.body, file);
  std::string second = Upload({Line("c")});
  clock_.Advance(absl::Seconds(1));
  std::string third = Upload({Line("d")});
  Reply list = Send("GET", "/v1/files?limit=2", submitter_);
  ASSERT_EQ(list.status, 200) << list.body;
  ASSERT_EQ(list.json["data"].size(), 2u);
  EXPECT_EQ(list.json["data"][0]["id"], third);  // newest first
  EXPECT_TRUE(list.json["has_more"].get<bool>());
  Reply rest = Send("GET", "/v1/files?limit=2&after=" + list.json["last_id"].get<std::string>(), submitter_);
  EXPECT_EQ(rest.json["data"].size(), 1u);
  EXPECT_FALSE(rest.json["has_more"].get<bool>());
  EXPECT_EQ(Send("GET", "/v1/files?purpose=batch_output", submitter_).json["data"].size(), 0u);
  EXPECT_EQ(Send("GET", "/v1/files?order=asc", submitter_).json["data"].size(), 3u);
  Reply deleted = Send("DELETE", "/v1/files/" + id, submitter_);
  EXPECT_EQ(deleted.status, 200) << deleted.body;
  EXPECT_TRUE(deleted.json["deleted"].get<bool>());
  ExpectError(Send("GET", "/v1/files/" + id, submitter_), 404);
  ExpectError(Send("GET", "/v1/files/" + id + "/content", submitter_), 404);
  EXPECT_EQ(Objects(keys::OpenAiFiles("search")).size(), 4u);  // two files left, each with its record
}

TEST_F(OpenAiApiTest, AChunkedUploadWithExpectContinueArrivesWhole) {
  std::string form = Form(Line("a") + "\n");
  std::string bytes = absl::StrCat("POST /v1/files HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ", submitter_,
                                   "\r\nContent-Type: ", kFormType,
                                   "\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n");
  for (size_t i = 0; i < form.size(); i += 7) {
    std::string piece = form.substr(i, 7);
    absl::StrAppend(&bytes, absl::Hex(piece.size()), "\r\n", piece, "\r\n");
  }
  bytes += "0\r\n\r\n";
  Reply reply = Raw(port_, bytes);
  // The interim "100 Continue" comes first; the final answer follows it.
  EXPECT_EQ(reply.status, 100);
  EXPECT_THAT(reply.body, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(reply.body, HasSubstr("\"bytes\":" + std::to_string(Line("a").size() + 1)));
}

TEST_F(OpenAiApiTest, MalformedUploadsAreRefusedAndLeaveNothing) {
  ExpectError(Send("POST", "/v1/files", submitter_, "{}", "application/json"), 400, "multipart/form-data");
  ExpectError(Send("POST", "/v1/files", submitter_, "--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nab",
                   kFormType),
              400, "malformed");
  ExpectError(Send("POST", "/v1/files", submitter_, "garbage without any boundary", kFormType), 400);
  ExpectError(Send("POST", "/v1/files", submitter_,
                   "--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--XyZ--\r\n", kFormType),
              400, "file");
  ExpectError(Send("POST", "/v1/files", submitter_, Form(Line("a"), "fine-tune"), kFormType), 400, "purpose");
  // A body shorter than its Content-Length: the client gives up; the server answers or closes.
  std::string short_body = Request("POST", "/v1/files", submitter_, Form(Line("a")), kFormType);
  short_body.resize(short_body.size() - 20);
  Reply cut = Raw(port_, short_body);  // the read times out (5 s) and the upload is dropped
  EXPECT_TRUE(cut.status == 400 || cut.status == 0) << cut.status;
  EXPECT_TRUE(Objects("openai/").empty());
}

TEST_F(OpenAiApiTest, OversizedUploadsAre413AndLeaveNothing) {
  std::string big(100 << 10, 'x');
  // Declared too large: refused before the body is read.
  ExpectError(Send("POST", "/v1/files", submitter_, Form(big), kFormType), 413, "too large");
  // Streamed (chunked, no length): refused once it passes the limit.
  std::string form = Form(big);
  std::string bytes = absl::StrCat("POST /v1/files HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ", submitter_,
                                   "\r\nContent-Type: ", kFormType, "\r\nTransfer-Encoding: chunked\r\n\r\n");
  absl::StrAppend(&bytes, absl::Hex(form.size()), "\r\n", form, "\r\n0\r\n\r\n");
  ExpectError(Raw(port_, bytes), 413, "too large");
  EXPECT_TRUE(Objects("openai/").empty());
  // Malformed chunk framing.
  std::string bad = absl::StrCat("POST /v1/files HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ", submitter_,
                                 "\r\nContent-Type: ", kFormType, "\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
  ExpectError(Raw(port_, bad), 400);
  // And the server still serves.
  EXPECT_EQ(Send("GET", "/v1/files", submitter_).status, 200);
}

TEST_F(OpenAiApiTest, BadJsonIsA400) {
  ExpectError(Send("POST", "/v1/batches", submitter_, "{not json"), 400, "parse the JSON");
  ExpectError(Send("POST", "/v1/batches", submitter_, "[1,2]"), 400);
  ExpectError(Send("POST", "/v1/batches", submitter_, std::string(70, '[')), 400);
  ExpectError(Send("POST", "/v1/batches", submitter_, std::string(2 << 20, ' ')), 413);
  Reply missing = Send("POST", "/v1/batches", submitter_, "{}");
  ExpectError(missing, 400, "input_file_id");
  EXPECT_EQ(missing.json["error"]["param"], "input_file_id");
  std::string id = Upload({Line("a")});
  ExpectError(Send("POST", "/v1/batches", submitter_,
                   DumpJson(Json{{"input_file_id", id}, {"endpoint", "/v1/images"}, {"completion_window", "24h"}})),
              400, "endpoint");
  ExpectError(Send("POST", "/v1/batches", submitter_,
                   DumpJson(Json{{"input_file_id", id}, {"endpoint", "/v1/chat/completions"},
                                 {"completion_window", "forever"}})),
              400, "completion_window");
  ExpectError(Send("POST", "/v1/batches", submitter_,
                   DumpJson(Json{{"input_file_id", id}, {"endpoint", "/v1/chat/completions"},
                                 {"completion_window", "24h"}, {"metadata", {{"k", 5}}}})),
              400, "metadata");
  EXPECT_TRUE(Must(store_->ListJobs({})).empty());
}

TEST_F(OpenAiApiTest, ABatchIsAJobOfTheKeysTeam) {
  std::string file = Upload({Line("a"), Line("b"), Line("c")});
  Reply created = CreateBatch(file);
  ASSERT_EQ(created.status, 200) << created.body;
  const Json& batch = created.json;
  EXPECT_EQ(batch["object"], "batch");
  EXPECT_EQ(batch["status"], "in_progress");
  EXPECT_EQ(batch["input_file_id"], file);
  EXPECT_EQ(batch["endpoint"], "/v1/chat/completions");
  EXPECT_EQ(batch["completion_window"], "24h");
  EXPECT_EQ(batch["request_counts"]["total"], 3);
  EXPECT_EQ(batch["metadata"]["purpose"], "test");
  EXPECT_TRUE(batch["errors"].is_null());
  EXPECT_FALSE(batch.contains("usage")) << "usage comes when the batch ends (openai_check.mjs checks its sums)";
  EXPECT_EQ(batch["expires_at"].get<int64_t>() - batch["created_at"].get<int64_t>(), 24 * 3600);
  for (const char* field : {"in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
                            "cancelling_at", "cancelled_at", "output_file_id", "error_file_id"}) {
    EXPECT_TRUE(batch.contains(field)) << field;
  }
  Job job = Must(store_->GetJob(batch["id"]));
  EXPECT_EQ(job.spec.team, "search");
  EXPECT_EQ(job.spec.owner, "alice");
  EXPECT_EQ(job.spec.model, std::filesystem::absolute(dir_ + "/models/tiny.gguf").string());
  EXPECT_EQ(job.spec.input_key, keys::OpenAiFiles("search") + file);
  // The file is in use: it cannot be deleted while the batch runs.
  ExpectError(Send("DELETE", "/v1/files/" + file, submitter_), 409, "has not ended");
  // Another team sees neither the batch nor the file, exactly as if they did not exist.
  Reply hidden = Send("GET", "/v1/batches/" + batch["id"].get<std::string>(), other_team_);
  Reply unknown = Send("GET", "/v1/batches/job-doesnotexist", other_team_);
  ExpectError(hidden, 404);
  EXPECT_EQ(hidden.json["error"]["message"].get<std::string>().find(batch["id"].get<std::string>()) != std::string::npos,
            true);
  EXPECT_EQ(unknown.status, 404);
  ExpectError(Send("GET", "/v1/files/" + file, other_team_), 404);
  ExpectError(Send("POST", "/v1/batches/" + batch["id"].get<std::string>() + "/cancel", other_team_), 404);
  Reply theirs = Send("POST", "/v1/batches", other_team_,
                      DumpJson(Json{{"input_file_id", file}, {"endpoint", "/v1/chat/completions"},
                                    {"completion_window", "24h"}}));
  ExpectError(theirs, 400, "no such file");
  EXPECT_EQ(Send("GET", "/v1/batches", other_team_).json["data"].size(), 0u);
}

TEST_F(OpenAiApiTest, BatchesListNewestFirstWithCursors) {
  std::string file = Upload({Line("a")});
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(CreateBatch(file).json["id"]);
    clock_.Advance(absl::Seconds(1));
  }
  Reply page = Send("GET", "/v1/batches?limit=2", submitter_);
  ASSERT_EQ(page.status, 200) << page.body;
  ASSERT_EQ(page.json["data"].size(), 2u);
  EXPECT_EQ(page.json["data"][0]["id"], ids[2]);
  EXPECT_EQ(page.json["data"][1]["id"], ids[1]);
  EXPECT_TRUE(page.json["has_more"].get<bool>());
  Reply next = Send("GET", "/v1/batches?limit=2&after=" + ids[1], submitter_);
  ASSERT_EQ(next.json["data"].size(), 1u);
  EXPECT_EQ(next.json["data"][0]["id"], ids[0]);
  EXPECT_FALSE(next.json["has_more"].get<bool>());
  ExpectError(Send("GET", "/v1/batches?limit=0", submitter_), 400);
}

// A finished batch's usage is its job's token sums, the reasoning tokens among them
// (output_tokens_details.reasoning_tokens: the sum of its answers' own).
TEST_F(OpenAiApiTest, AFinishedBatchsUsageCarriesItsReasoningTokens) {
  std::string id = CreateBatch(Upload({Line("a")})).json["id"];
  ExecutorInfo info;
  info.name = "e";
  info.memory_bytes = int64_t{64} << 30;
  Executor executor = Must(store_->RegisterExecutor("", info, clock_.Now()));
  ASSERT_EQ(Must(store_->LeaseTasks(executor.id, 1, absl::Minutes(1), clock_.Now())).size(), 1u);
  Must(store_->CompleteTask(executor.id, id, 0, 1, 1, 0, clock_.Now()));
  Must(store_->FinishJob(id, "o.jsonl", "e.jsonl", "m.json", clock_.Now(), JobState::kCompleted,
                         TokenUsage{.prompt_tokens = 12, .completion_tokens = 40, .reasoning_tokens = 25}));
  Reply batch = Send("GET", "/v1/batches/" + id, submitter_);
  ASSERT_EQ(batch.status, 200) << batch.body;
  EXPECT_EQ(batch.json["status"], "completed");
  EXPECT_EQ(batch.json["usage"], (Json{{"input_tokens", 12},
                                       {"input_tokens_details", {{"cached_tokens", 0}}},
                                       {"output_tokens", 40},
                                       {"output_tokens_details", {{"reasoning_tokens", 25}}},
                                       {"total_tokens", 52}}));
}

TEST_F(OpenAiApiTest, ARetriedCreateWithItsIdempotencyKeyMakesOneBatch) {
  std::string file = Upload({Line("a")});
  Reply first = CreateBatch(file, "Idempotency-Key: retry-1\r\n");
  Reply again = CreateBatch(file, "Idempotency-Key: retry-1\r\n");
  Reply other = CreateBatch(file, "Idempotency-Key: retry-2\r\n");
  ASSERT_EQ(first.status, 200);
  EXPECT_EQ(again.json["id"], first.json["id"]);
  EXPECT_NE(other.json["id"], first.json["id"]);
  EXPECT_EQ(Must(store_->ListJobs({})).size(), 2u);
}

TEST_F(OpenAiApiTest, AFileThatFailsValidationMakesAFailedBatchWithLineErrors) {
  std::string file = Upload({Line("a"), "not json", Line("a"), Line("c", "tiny", "/v1/embeddings"), Line("d", "other"),
                             DumpJson(Json{{"custom_id", "e"}, {"method", "POST"}, {"url", "/v1/chat/completions"}})});
  Reply created = CreateBatch(file);
  ASSERT_EQ(created.status, 200) << created.body;
  EXPECT_EQ(created.json["status"], "failed");
  EXPECT_TRUE(created.json["failed_at"].is_number());
  const Json& errors = created.json["errors"]["data"];
  ASSERT_EQ(errors.size(), 5u) << created.body;
  EXPECT_EQ(errors[0]["line"], 2);
  EXPECT_EQ(errors[0]["code"], "invalid_json_line");
  EXPECT_EQ(errors[1]["line"], 3);
  EXPECT_EQ(errors[1]["code"], "duplicate_custom_id");
  EXPECT_THAT(errors[1]["message"].get<std::string>(), HasSubstr("custom_id 'a' on line 3 is already on line 1"));
  EXPECT_EQ(errors[2]["code"], "mismatched_endpoint");
  EXPECT_EQ(errors[3]["line"], 5);
  EXPECT_EQ(errors[3]["code"], "mismatched_model");
  EXPECT_EQ(errors[4]["code"], "missing_required_parameter");
  // Still a job (failed), so the CLI and dashboard show it; its tasks never existed.
  Job job = Must(store_->GetJob(created.json["id"]));
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_THAT(job.error, HasSubstr("validation failed"));
  EXPECT_EQ(Send("GET", "/v1/batches/" + job.id, submitter_).json["errors"], created.json["errors"]);
}

TEST_F(OpenAiApiTest, AnUnknownModelFailsValidationNamingTheModelsThereAre) {
  std::string file = Upload({Line("a", "gpt-4o"), Line("b", "gpt-4o")});
  Reply created = CreateBatch(file);
  EXPECT_EQ(created.json["status"], "failed");
  const Json& error = created.json["errors"]["data"][0];
  EXPECT_EQ(error["code"], "model_not_found");
  EXPECT_THAT(error["message"].get<std::string>(), HasSubstr("gpt-4o"));
  EXPECT_THAT(error["message"].get<std::string>(), HasSubstr("other, tiny"));
}

TEST_F(OpenAiApiTest, CancelSaysCancellingThenCancelledWithAnErrorLinePerRecord) {
  std::string file = Upload({Line("a"), Line("b")});
  std::string id = CreateBatch(file).json["id"];
  Reply cancelling = Send("POST", "/v1/batches/" + id + "/cancel", submitter_);
  ASSERT_EQ(cancelling.status, 200) << cancelling.body;
  EXPECT_EQ(cancelling.json["status"], "cancelling");
  EXPECT_TRUE(cancelling.json["cancelling_at"].is_number());
  Reply cancelled = Send("GET", "/v1/batches/" + id, submitter_);
  EXPECT_EQ(cancelled.json["status"], "cancelled");
  EXPECT_TRUE(cancelled.json["cancelled_at"].is_number());
  ASSERT_TRUE(cancelled.json["error_file_id"].is_string()) << cancelled.body;
  Reply errors = Send("GET", "/v1/files/" + cancelled.json["error_file_id"].get<std::string>() + "/content", submitter_);
  EXPECT_EQ(errors.status, 200);
  EXPECT_THAT(errors.body, HasSubstr("batch_cancelled"));
  EXPECT_EQ(std::count(errors.body.begin(), errors.body.end(), '\n'), 2);
  Reply output = Send("GET", "/v1/files/" + cancelled.json["output_file_id"].get<std::string>() + "/content", submitter_);
  EXPECT_EQ(output.status, 200);
  EXPECT_EQ(output.body, "");
  // Nothing ran, so nothing was used (openai_check.mjs checks the sums of a partial output).
  EXPECT_EQ(cancelled.json["usage"]["input_tokens"], 0) << cancelled.body;
  EXPECT_EQ(cancelled.json["usage"]["output_tokens"], 0);
  // Another team cannot read the results.
  ExpectError(Send("GET", "/v1/files/" + cancelled.json["error_file_id"].get<std::string>() + "/content", other_team_),
              404);
  // Cancelling again is harmless; the file is free to delete now.
  EXPECT_EQ(Send("POST", "/v1/batches/" + id + "/cancel", submitter_).json["status"], "cancelled");
  EXPECT_EQ(Send("DELETE", "/v1/files/" + file, submitter_).status, 200);
}

TEST_F(OpenAiApiTest, ModelsListTheCatalog) {
  Reply models = Send("GET", "/v1/models", viewer_);
  ASSERT_EQ(models.status, 200) << models.body;
  ASSERT_EQ(models.json["data"].size(), 2u);
  EXPECT_EQ(models.json["data"][0]["id"], "other");
  EXPECT_EQ(models.json["data"][1]["id"], "tiny");
  EXPECT_EQ(Send("GET", "/v1/models/tiny", viewer_).json["object"], "model");
  ExpectError(Send("GET", "/v1/models/gpt-4o", viewer_), 404, "tiny");
}

// A record's `model` names a model of the key's team in the registry (`minions models push`):
// the batch's job runs those bytes, pinned by digest; another team cannot name it.
TEST_F(OpenAiApiTest, RecordModelsResolveThroughTheTeamsRegistry) {
  auto add = [&](const std::string& team, const std::string& name, char digit) -> std::string {
    ModelRecord model;
    model.team = team;
    model.name = name;
    model.digest = "sha256:" + std::string(64, digit);
    model.size_bytes = 1 << 20;
    model.facts.architecture = "llama";
    model.facts.layers = 2;
    model.facts.embedding_size = 64;
    model.facts.heads = 4;
    model.facts.kv_heads = 4;
    model.facts.head_dim = 16;
    model.facts.context_length = 512;
    model.blob_key = keys::ModelBlob(team, std::string(64, digit));
    model.created_by = "alice";
    model.created_at = clock_.Now();
    EXPECT_TRUE(store_->AddModel(model).ok());
    return model.digest;
  };
  add("search", "llama-8b", 'a');
  clock_.Advance(absl::Seconds(5));
  const std::string newest = add("search", "llama-8b", 'b');
  add("ads", "ads-only", 'c');

  Reply models = Send("GET", "/v1/models", viewer_);
  ASSERT_EQ(models.status, 200) << models.body;
  std::vector<std::string> ids;
  for (const Json& m : models.json["data"]) ids.push_back(m["id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{"llama-8b", "other", "tiny"}));  // each name once; not ads'
  EXPECT_EQ(Send("GET", "/v1/models/llama-8b", viewer_).json["id"], "llama-8b");
  ExpectError(Send("GET", "/v1/models/ads-only", viewer_), 404, "llama-8b");

  Reply created = CreateBatch(Upload({Line("a", "llama-8b"), Line("b", "llama-8b")}));
  ASSERT_EQ(created.status, 200) << created.body;
  Job job = Must(store_->GetJob(created.json["id"]));
  EXPECT_EQ(job.spec.model, "llama-8b");
  EXPECT_EQ(job.spec.model_digest, newest);  // the newest bytes of the name
  EXPECT_GT(job.spec.requirements.estimate_bytes, 1 << 20);

  // Another team's registry model is unknown to this team's key.
  Reply theirs = CreateBatch(Upload({Line("a", "ads-only")}));
  ASSERT_EQ(theirs.status, 200) << theirs.body;
  EXPECT_EQ(theirs.json["status"], "failed");
  EXPECT_EQ(theirs.json["errors"]["data"][0]["code"], "model_not_found") << theirs.body;
}

}  // namespace
}  // namespace minions::openai
