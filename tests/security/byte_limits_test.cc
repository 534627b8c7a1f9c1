// Per-team byte limits (issue 40, point 5; docs/security.md 40.5b): a team that would keep more
// bytes of files (job inputs, OpenAI files), models or results than its limit is refused, told
// which limit and which verb raises it, and nothing of the refused upload is kept; another team
// is still served.

#include "cli/admin_verbs.h"
#include "common/json_util.h"
#include "identity/identity_admin.h"
#include "openai/openai_api.h"
#include "secure_server.h"
#include "server/keys.h"
#include "testing/http_get.h"
#include "testing/status_checks.h"

namespace minions::testing {
namespace {

class ByteLimitAttack : public SecureServer {
 protected:
  void SetUp() override {
    SecureServer::SetUp();
    ServerOptions options = Options();
    options.background_thread = false;  // the test finalises jobs itself
    StartServer(options);
    // "small" keeps little; "search" has the defaults of a new team.
    Team small;
    small.name = "small";
    small.max_file_bytes = 4000;
    small.max_model_bytes = 3 << 20;
    small.max_result_bytes = 10;
    Must(server_->identities().CreateTeam(small));
    CreateTeam("search");
    small_ = Issue(Role::kSubmitter, "small", "sam");
    search_ = Issue(Role::kSubmitter, "search", "alice");
  }

  std::vector<std::string> Objects(const std::string& prefix) { return Must(blobs_->List(prefix)); }
  Team StoredTeam(const std::string& name) { return Must(store_->GetTeam(name)); }
  // An input sent in parts (Jobs.UploadInput) as `token`'s holder, naming `team` in its first part.
  std::pair<grpc::Status, v1::UploadInputResponse> Upload(const std::string& token, const std::vector<std::string>& parts,
                                                          const std::string& team = "") {
    grpc::ClientContext context;
    rpc::Prepare(context, token, absl::Seconds(30));
    v1::UploadInputResponse reply;
    auto writer = jobs_->UploadInput(&context, &reply);
    for (const std::string& data : parts) {
      v1::UploadInputRequest part;
      part.set_team(team);
      part.set_data(data);
      if (!writer->Write(part)) break;
    }
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    return {status, reply};
  }

  std::string small_, search_;
};

TEST_F(ByteLimitAttack, ANewTeamHasByteLimitsByDefault) {
  const Team search = StoredTeam("search");
  EXPECT_EQ(search.max_file_bytes, IdentityAdmin::kDefaultMaxFileBytes);
  EXPECT_EQ(search.max_model_bytes, IdentityAdmin::kDefaultMaxModelBytes);
  EXPECT_EQ(search.max_result_bytes, IdentityAdmin::kDefaultMaxResultBytes);
}

TEST_F(ByteLimitAttack, AnInlineInputPastTheTeamsFileLimitIsRefusedAndNothingIsKept) {
  v1::Job job;
  ASSERT_GRPC_OK(jobs_->SubmitJob(As(small_).get(), Request(40), &job));  // ~1.4 KB: within 4000
  const int64_t kept = StoredTeam("small").file_bytes;
  EXPECT_EQ(kept, static_cast<int64_t>(Records(40).size()));
  ASSERT_THAT(Objects(keys::Uploads("small", "sam")), SizeIs(1));
  // 80 more records (~2.9 KB) would pass 4000: refused, saying which limit and how to raise it.
  grpc::Status refused = jobs_->SubmitJob(As(small_).get(), Request(80), &job);
  EXPECT_GRPC_CODE(refused, RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("minions admin team set small --max-file-bytes"));
  EXPECT_THAT(Objects(keys::Uploads("small", "sam")), SizeIs(1));  // nothing of it kept
  EXPECT_EQ(StoredTeam("small").file_bytes, kept);                 // nor charged
  EXPECT_THAT(Must(store_->ListJobs({std::nullopt, "small", 100})), SizeIs(1));
  // Another team is served.
  ASSERT_GRPC_OK(jobs_->SubmitJob(As(search_).get(), Request(80), &job));
  // A smaller input still fits the team's room.
  ASSERT_GRPC_OK(jobs_->SubmitJob(As(small_).get(), Request(10), &job));
}

// The same limit on an input sent in parts (Jobs.UploadInput): the stream is stopped once it
// passes the team's room, and nothing of it is kept; parts larger than 1 MiB are refused.
TEST_F(ByteLimitAttack, AnInputUploadPastTheTeamsFileLimitIsStoppedAndNothingIsKept) {
  auto upload = [&](const std::string& token, const std::vector<std::string>& parts) { return Upload(token, parts); };
  const std::string records = Records(50, "a");  // ~1.8 KB
  auto [first, kept] = upload(small_, {Records(50, "a")});
  ASSERT_GRPC_OK(first);
  EXPECT_EQ(kept.size_bytes(), static_cast<int64_t>(records.size()));
  EXPECT_EQ(StoredTeam("small").file_bytes, kept.size_bytes());
  // Two more parts of it pass 4000 bytes: refused, naming the limit; the object is gone.
  auto [refused, none] = upload(small_, {Records(50, "b"), Records(50, "c")});
  EXPECT_GRPC_CODE(refused, RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--max-file-bytes"));
  EXPECT_THAT(Objects(keys::Uploads("small", "sam")), SizeIs(1));
  EXPECT_EQ(StoredTeam("small").file_bytes, kept.size_bytes());
  // A part larger than 1 MiB is refused whatever the room.
  auto [too_big, nothing] = upload(search_, {std::string(kInputPartBytes + 1, 'x')});
  EXPECT_GRPC_CODE(too_big, INVALID_ARGUMENT);
  EXPECT_THAT(Objects(keys::Uploads("search", "alice")), IsEmpty());
  // Another team's upload in parts is served and submits; the uploaded input is its own.
  auto [served, uploaded] = upload(search_, {Records(50, "a"), Records(50, "b"), Records(50, "c")});
  ASSERT_GRPC_OK(served);
  v1::SubmitJobRequest request = Request(1);
  request.clear_input();
  request.set_input_key(uploaded.input_key());
  v1::Job job;
  ASSERT_GRPC_OK(jobs_->SubmitJob(As(search_).get(), request, &job));
  EXPECT_EQ(job.request_counts().total(), 150);
  // Another team cannot submit it.
  EXPECT_GRPC_CODE(jobs_->SubmitJob(As(small_).get(), request, &job), PERMISSION_DENIED);
}

// Jobs.UploadInput asks what SubmitJob asks: a submitter's (or an admin's) token, for its own
// team. No token, a viewer's, and a submitter naming another team are refused, and nothing of
// their parts is kept or charged.
TEST_F(ByteLimitAttack, AnInputInPartsNeedsASubmittersTokenForItsOwnTeam) {
  const std::string records = Records(20, "a");
  EXPECT_GRPC_CODE(Upload("", {records}).first, UNAUTHENTICATED);
  const std::string viewer = Issue(Role::kViewer, "search", "bob");
  grpc::Status by_viewer = Upload(viewer, {records}).first;
  EXPECT_GRPC_CODE(by_viewer, PERMISSION_DENIED);
  EXPECT_GRPC_ERROR(Upload(small_, {records}, "search").first, PERMISSION_DENIED, "cannot submit jobs for team search");
  EXPECT_THAT(Objects("uploads/search/"), IsEmpty());
  EXPECT_THAT(Objects("uploads/small/"), IsEmpty());
  EXPECT_EQ(StoredTeam("search").file_bytes, 0);
  EXPECT_EQ(StoredTeam("small").file_bytes, 0);
  // The holder of the team's submitter token, for its own team, is served.
  ASSERT_GRPC_OK(Upload(search_, {records}, "search").first);
  EXPECT_EQ(StoredTeam("search").file_bytes, static_cast<int64_t>(records.size()));
}

TEST_F(ByteLimitAttack, AModelPushPastTheTeamsModelLimitIsRefusedBeforeAByteIsSent) {
  AddModel("small", "kept", "sha256:" + std::string(64, 'a'));  // 1 byte
  v1::StartModelPushRequest start;
  start.set_name("huge");
  start.set_digest("sha256:" + std::string(64, 'b'));
  start.set_size_bytes(3 << 20);  // with the byte kept: one past the limit
  auto models = v1::Models::NewStub(Must(rpc::OpenChannel(server_->address(), {})));
  v1::StartModelPushResponse started;
  grpc::Status refused = models->StartModelPush(As(small_).get(), start, &started);
  EXPECT_GRPC_CODE(refused, RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("minions admin team set small --max-model-bytes"));
  // Parts sent without a start are refused too, and nothing of the push is kept.
  v1::UploadModelPartRequest part;
  part.set_digest(start.digest());
  part.set_size_bytes(start.size_bytes());
  part.set_part_number(1);
  part.set_data(std::string(start.size_bytes(), 'x'));  // its one part
  v1::UploadModelPartResponse uploaded;
  EXPECT_GRPC_CODE(models->UploadModelPart(As(small_).get(), part, &uploaded), RESOURCE_EXHAUSTED);
  EXPECT_THAT(Objects("model-uploads/small/"), IsEmpty());
  // The same push one byte smaller fits; another team's push of the same size starts.
  start.set_size_bytes((3 << 20) - 1);
  ASSERT_GRPC_OK(models->StartModelPush(As(small_).get(), start, &started));
  start.set_size_bytes(3 << 20);
  ASSERT_GRPC_OK(models->StartModelPush(As(search_).get(), start, &started));
}

TEST_F(ByteLimitAttack, AModelThatNoLongerFitsWhenItsPushFinishesIsRefusedAndItsPartsRemoved) {
  auto models = v1::Models::NewStub(Must(rpc::OpenChannel(server_->address(), {})));
  const int64_t size = 2 << 20;
  v1::StartModelPushRequest start;
  start.set_name("late");
  start.set_digest("sha256:" + std::string(64, 'c'));
  start.set_size_bytes(size);
  v1::StartModelPushResponse started;
  ASSERT_GRPC_OK(models->StartModelPush(As(small_).get(), start, &started));
  ASSERT_GT(started.part_size(), 0);
  for (int64_t part = 1, sent = 0; sent < size; ++part) {
    v1::UploadModelPartRequest request;
    request.set_digest(start.digest());
    request.set_size_bytes(size);
    request.set_part_number(static_cast<int>(part));
    const int64_t n = std::min<int64_t>(started.part_size(), size - sent);
    request.set_data(std::string(n, 'x'));
    v1::UploadModelPartResponse uploaded;
    ASSERT_GRPC_OK(models->UploadModelPart(As(small_).get(), request, &uploaded));
    sent += n;
  }
  ASSERT_THAT(Objects("model-uploads/small/"), Not(IsEmpty()));
  // Meanwhile another push of the team took the room (2 MiB of the 3).
  ModelRecord other;
  other.team = "small";
  other.name = "first";
  other.digest = "sha256:" + std::string(64, 'd');
  other.size_bytes = 2 << 20;
  other.blob_key = "models/x";
  other.created_at = absl::Now();
  Must(store_->AddModel(other));
  v1::FinishModelPushRequest finish;
  finish.set_name("late");
  finish.set_digest(start.digest());
  finish.set_size_bytes(size);
  v1::Model model;
  EXPECT_GRPC_ERROR(models->FinishModelPush(As(small_).get(), finish, &model), RESOURCE_EXHAUSTED, "--max-model-bytes");
  EXPECT_THAT(Objects("model-uploads/small/"), IsEmpty());
  EXPECT_THAT(Objects("models/small/"), IsEmpty());
}

TEST_F(ByteLimitAttack, AFilePastTheTeamsFileLimitIsRefusedAsItArrivesAndNothingIsKept) {
  // The OpenAI API over the server's store and object store, as `minions server` installs it.
  Authenticator auth(store_.get(), &clock_);
  JobService jobs(store_.get(), blobs_.get(), &clock_, &auth, ServerOptions{});
  openai::FolderModelCatalog folders({dir_});
  openai::RegistryModelCatalog catalog(store_.get(), &folders);
  openai::OpenAiApi api({store_.get(), blobs_.get(), &clock_, &auth, &jobs, &catalog, {}}, openai::OpenAiApiOptions{});
  HttpServer http(HttpServerOptions{});
  api.Install(&http);
  ASSERT_OK(http.Start("127.0.0.1:0"));
  const std::string base = absl::StrCat("http://127.0.0.1:", http.port());
  auto upload = [&](const std::string& token, const std::string& file) {
    const std::string form =
        absl::StrCat("--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n",
                     "Content-Type: application/jsonl\r\n\r\n", file,
                     "\r\n--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--XyZ--\r\n");
    return HttpPost(base + "/v1/files", form,
                    {"Authorization: Bearer " + token, "Content-Type: multipart/form-data; boundary=XyZ"});
  };
  HttpReply first = upload(small_, Records(60));  // ~2.2 KB: within 4000
  ASSERT_EQ(first.status, 200) << first.body;
  const int64_t kept = StoredTeam("small").file_bytes;
  EXPECT_EQ(kept, static_cast<int64_t>(Records(60).size()));
  HttpReply refused = upload(small_, Records(60));
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_THAT(refused.body, HasSubstr("insufficient_quota"));
  EXPECT_THAT(refused.body, HasSubstr("--max-file-bytes"));
  EXPECT_EQ(StoredTeam("small").file_bytes, kept);
  EXPECT_THAT(Objects(keys::OpenAiFiles("small")), SizeIs(2));  // the first file and its description
  // Another team is served; deleting the first file gives its bytes back.
  EXPECT_EQ(upload(search_, Records(60)).status, 200);
  const std::string id = Must(ParseJson(first.body)).value("id", "");
  HttpOptions remove;
  remove.method = "DELETE";
  remove.headers = {"Authorization: Bearer " + small_};
  EXPECT_EQ(HttpRequestOnce(base + "/v1/files/" + id, remove).status, 200);
  EXPECT_EQ(StoredTeam("small").file_bytes, 0);
  EXPECT_EQ(upload(small_, Records(60)).status, 200);
  http.Stop();
}

TEST_F(ByteLimitAttack, ATeamKeepingItsLimitOfResultsGetsNoNewJob) {
  v1::Job job = MustSubmit(small_, 2);
  Enrolled executor = Enrol("worker");
  std::vector<v1::TaskLease> leases = MustLease(executor, 4);
  ASSERT_THAT(leases, SizeIs(1));
  ASSERT_GRPC_OK(CompleteLease(executor, leases[0]));
  ASSERT_OK(server_->FinalizeReportedJobs());
  ASSERT_OK(server_->SweepReadyJobs());
  ASSERT_EQ(StoreJob(job.id()).state, JobState::kCompleted);
  // Its results were kept, whatever the limit (work done is never thrown away), and counted.
  EXPECT_GT(StoredTeam("small").result_bytes, 10);
  v1::Job next;
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(As(small_).get(), Request(2), &next), RESOURCE_EXHAUSTED, "minions admin team set small --max-result-bytes");
  ASSERT_GRPC_OK(jobs_->SubmitJob(As(search_).get(), Request(2), &next));
  // An admin raises it: served again.
  Team raised = StoredTeam("small");
  raised.max_result_bytes = 0;
  Must(server_->identities().UpdateTeam(raised));
  ASSERT_GRPC_OK(jobs_->SubmitJob(As(small_).get(), Request(2), &next));
}

// What `minions admin team set --max-file-bytes` and its kin take.
TEST(TeamByteSizes, AreParsedWithBinarySuffixesAndAnythingElseIsRefused) {
  EXPECT_EQ(Must(cli::ParseByteSize("0")), 0);
  EXPECT_EQ(Must(cli::ParseByteSize("123")), 123);
  EXPECT_EQ(Must(cli::ParseByteSize("64K")), int64_t{64} << 10);
  EXPECT_EQ(Must(cli::ParseByteSize("500m")), int64_t{500} << 20);
  EXPECT_EQ(Must(cli::ParseByteSize("200G")), int64_t{200} << 30);
  EXPECT_EQ(Must(cli::ParseByteSize("200GiB")), int64_t{200} << 30);
  EXPECT_EQ(Must(cli::ParseByteSize("1TB")), int64_t{1} << 40);
  for (const char* bad : {"", "G", "-1", "1.5G", "12X", "99999999999T", "ten"}) {
    EXPECT_FALSE(cli::ParseByteSize(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace minions::testing
