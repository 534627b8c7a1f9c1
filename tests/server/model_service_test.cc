// The model registry through real stubs: push (in parts, resumable, deduplicated), list, show,
// rm (refused while a job needs the model), and jobs that name a model by name or by digest.

#include "common/sha256.h"
#include "grpc_service_fixture.h"
#include "model/model_ref.h"
#include "server/keys.h"
#include "testing/gguf_builder.h"

namespace minions::testing {
namespace {

std::string DigestOf(const std::string& bytes) {
  Sha256 hash;
  hash.Update(bytes);
  return "sha256:" + hash.HexDigest();
}

class ModelServiceTest : public GrpcServiceTest {
 protected:
  void StartModels(int64_t part_bytes = 1 << 20) {
    ServerOptions options = Options();
    options.model_part_bytes = part_bytes;
    StartServer(&fake_clock_, options);
    models_ = v1::Models::NewStub(rpc::MakeChannel(server_->address()));
    Team search;
    search.name = "search";
    search.created_at = fake_clock_.Now();
    ASSERT_OK(store_->CreateTeam(search));
    submitter_ = Issue(Role::kSubmitter, "search", "alice");
    viewer_ = Issue(Role::kViewer, "search", "bob");
    other_ = Issue(Role::kSubmitter, "default", "eve");
  }

  // The parts of a push, as the client sends them.
  grpc::Status Start(const std::string& token, const std::string& name, const std::string& bytes,
                     v1::StartModelPushResponse* reply) {
    v1::StartModelPushRequest request;
    request.set_name(name);
    request.set_digest(DigestOf(bytes));
    request.set_size_bytes(static_cast<int64_t>(bytes.size()));
    return models_->StartModelPush(Context(&token).get(), request, reply);
  }
  grpc::Status Upload(const std::string& token, const std::string& bytes, int part, int64_t part_size,
                      const std::string& digest = "") {
    v1::UploadModelPartRequest request;
    request.set_digest(digest.empty() ? DigestOf(bytes) : digest);
    request.set_size_bytes(static_cast<int64_t>(bytes.size()));
    request.set_part_number(part);
    const size_t offset = static_cast<size_t>((part - 1) * part_size);
    request.set_data(offset < bytes.size() ? bytes.substr(offset, part_size) : std::string());
    v1::UploadModelPartResponse reply;
    return models_->UploadModelPart(Context(&token).get(), request, &reply);
  }
  grpc::Status Finish(const std::string& token, const std::string& name, const std::string& bytes, v1::Model* model,
                      const std::string& digest = "") {
    v1::FinishModelPushRequest request;
    request.set_name(name);
    request.set_digest(digest.empty() ? DigestOf(bytes) : digest);
    request.set_size_bytes(static_cast<int64_t>(bytes.size()));
    return models_->FinishModelPush(Context(&token).get(), request, model);
  }
  // A whole push; the parts sent.
  v1::Model MustPush(const std::string& name, const std::string& bytes, int* parts_sent = nullptr) {
    v1::StartModelPushResponse started;
    EXPECT_TRUE(Start(submitter_, name, bytes, &started).ok());
    if (started.done()) {
      if (parts_sent) *parts_sent = 0;
      return started.model();
    }
    const int64_t part_size = started.part_size();
    const int n = static_cast<int>((bytes.size() + part_size - 1) / part_size);
    std::set<int> present(started.parts_present().begin(), started.parts_present().end());
    int sent = 0;
    for (int part = 1; part <= n; ++part) {
      if (present.count(part)) continue;
      grpc::Status s = Upload(submitter_, bytes, part, part_size);
      EXPECT_TRUE(s.ok()) << s.error_message();
      ++sent;
    }
    if (parts_sent) *parts_sent = sent;
    v1::Model model;
    grpc::Status s = Finish(submitter_, name, bytes, &model);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return model;
  }
  v1::SubmitJobRequest ModelRequest(const std::string& model) {
    v1::SubmitJobRequest request = Request(Records(3));
    request.set_model(model);
    return request;
  }

  std::unique_ptr<v1::Models::Stub> models_;
  std::string submitter_, viewer_, other_;
};

TEST_F(ModelServiceTest, APushIsCheckedRecordedAndASecondPushOfTheSameBytesIsFree) {
  StartModels();
  const std::string bytes = TinyGguf(2'500'000);  // three parts of 1 MiB
  int sent = 0;
  v1::Model model = MustPush("tiny", bytes, &sent);
  EXPECT_EQ(sent, 3);
  EXPECT_EQ(model.team(), "search");
  EXPECT_EQ(model.digest(), DigestOf(bytes));
  EXPECT_EQ(model.size_bytes(), static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(model.architecture(), "llama");
  EXPECT_EQ(model.quantization(), "F16");
  EXPECT_EQ(model.layers(), 2);
  EXPECT_EQ(model.kv_heads(), 2);
  EXPECT_EQ(model.vocab_size(), 100);
  EXPECT_EQ(model.created_by(), "alice");
  EXPECT_GT(model.memory_bytes(), model.size_bytes());
  // The bytes are stored once, under the team and digest; the parts are gone.
  ASSERT_OK_AND_ASSIGN(std::string stored, blobs_->Get(keys::ModelBlob("search", DigestOf(bytes).substr(7))));
  EXPECT_EQ(stored, bytes);
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> parts, blobs_->List("model-uploads/"));
  EXPECT_THAT(parts, SizeIs(0));

  // The same bytes again, under another name: nothing to send.
  v1::StartModelPushResponse again;
  ASSERT_GRPC_OK(Start(submitter_, "tiny-copy", bytes, &again));
  EXPECT_TRUE(again.done());
  EXPECT_EQ(again.model().name(), "tiny-copy");
  EXPECT_EQ(again.model().digest(), model.digest());

  // Listed and shown to the team's viewer; by name, by digest.
  v1::ListModelsResponse listed;
  ASSERT_GRPC_OK(models_->ListModels(Context(&viewer_).get(), v1::ListModelsRequest(), &listed));
  ASSERT_THAT(listed.models(), SizeIs(2));
  v1::GetModelRequest get;
  get.set_model("tiny@" + model.digest());
  v1::Model shown;
  ASSERT_GRPC_OK(models_->GetModel(Context(&viewer_).get(), get, &shown));
  EXPECT_EQ(shown.name(), "tiny");
  EXPECT_EQ(shown.parameters(), 64 * 100);
}

TEST_F(ModelServiceTest, AnInterruptedPushResumesWithTheMissingParts) {
  StartModels();
  const std::string bytes = TinyGguf(2'500'000);
  v1::StartModelPushResponse started;
  ASSERT_GRPC_OK(Start(submitter_, "tiny", bytes, &started));
  ASSERT_GRPC_OK(Upload(submitter_, bytes, 1, started.part_size()));
  ASSERT_GRPC_OK(Upload(submitter_, bytes, 3, started.part_size()));
  // Finishing too early says which part is missing.
  v1::Model model;
  EXPECT_GRPC_ERROR(Finish(submitter_, "tiny", bytes, &model), FAILED_PRECONDITION, "part 2 of 3");
  // The push starts again (the client was killed): only part 2 is asked for.
  ASSERT_GRPC_OK(Start(submitter_, "tiny", bytes, &started));
  EXPECT_FALSE(started.done());
  EXPECT_THAT(started.parts_present(), ElementsAre(1, 3));
  int sent = 0;
  model = MustPush("tiny", bytes, &sent);
  EXPECT_EQ(sent, 1);
  EXPECT_EQ(model.digest(), DigestOf(bytes));
}

TEST_F(ModelServiceTest, BytesThatAreNotWhatThePusherNamedAreNeverStored) {
  StartModels();
  const std::string bytes = TinyGguf(1'500'000);
  const std::string lie = DigestOf("something else");
  v1::StartModelPushRequest start;
  start.set_name("tiny");
  start.set_digest(lie);
  start.set_size_bytes(static_cast<int64_t>(bytes.size()));
  v1::StartModelPushResponse started;
  ASSERT_GRPC_OK(models_->StartModelPush(Context(&submitter_).get(), start, &started));
  ASSERT_GRPC_OK(Upload(submitter_, bytes, 1, started.part_size(), lie));
  ASSERT_GRPC_OK(Upload(submitter_, bytes, 2, started.part_size(), lie));
  v1::Model model;
  EXPECT_GRPC_ERROR(Finish(submitter_, "tiny", bytes, &model, lie), INVALID_ARGUMENT, "nothing was stored");
  // Not a GGUF file: refused too.
  const std::string text(1'200'000, 'a');
  v1::StartModelPushResponse ignored;
  ASSERT_GRPC_OK(Start(submitter_, "text", text, &ignored));
  ASSERT_GRPC_OK(Upload(submitter_, text, 1, ignored.part_size()));
  ASSERT_GRPC_OK(Upload(submitter_, text, 2, ignored.part_size()));
  EXPECT_GRPC_ERROR(Finish(submitter_, "text", text, &model), INVALID_ARGUMENT, "not a GGUF model");
  // A part of the wrong size, a part out of range, a bad name: refused.
  EXPECT_GRPC_ERROR(Upload(submitter_, bytes, 3, started.part_size()), INVALID_ARGUMENT, "out of range");
  EXPECT_GRPC_ERROR(Upload(submitter_, bytes, 1, 1000), INVALID_ARGUMENT, "must have");
  EXPECT_GRPC_ERROR(Start(submitter_, "../etc", bytes, &ignored), INVALID_ARGUMENT, "not a model name");
  v1::ListModelsResponse listed;
  ASSERT_GRPC_OK(models_->ListModels(Context(&submitter_).get(), v1::ListModelsRequest(), &listed));
  EXPECT_THAT(listed.models(), SizeIs(0));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> stored, blobs_->List("models/"));
  EXPECT_THAT(stored, SizeIs(0));
}

TEST_F(ModelServiceTest, ModelsBelongToTheirTeam) {
  StartModels();
  const std::string bytes = TinyGguf(10'000);
  v1::Model model = MustPush("tiny", bytes);
  // Another team's submitter neither sees nor touches it, nor pushes for that team.
  v1::ListModelsResponse listed;
  ASSERT_GRPC_OK(models_->ListModels(Context(&other_).get(), v1::ListModelsRequest(), &listed));
  EXPECT_THAT(listed.models(), SizeIs(0));
  v1::GetModelRequest get;
  get.set_model("tiny");
  v1::Model shown;
  EXPECT_GRPC_ERROR(models_->GetModel(Context(&other_).get(), get, &shown), NOT_FOUND, "no model tiny");
  get.set_team("search");
  EXPECT_GRPC_ERROR(models_->GetModel(Context(&other_).get(), get, &shown), PERMISSION_DENIED, "team default");
  v1::RemoveModelRequest rm;
  rm.set_model("tiny");
  rm.set_team("search");
  v1::RemoveModelResponse removed;
  EXPECT_GRPC_ERROR(models_->RemoveModel(Context(&other_).get(), rm, &removed), PERMISSION_DENIED, "team default");
  // A viewer may look but not push or remove.
  v1::StartModelPushResponse started;
  EXPECT_GRPC_ERROR(Start(viewer_, "mine", bytes, &started), PERMISSION_DENIED, "");
  rm.clear_team();
  EXPECT_GRPC_ERROR(models_->RemoveModel(Context(&viewer_).get(), rm, &removed), PERMISSION_DENIED, "");
  // A job of another team cannot name it.
  v1::Job job;
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(Context(&other_).get(), ModelRequest("tiny"), &job), INVALID_ARGUMENT,
                    "has no model tiny");
}

TEST_F(ModelServiceTest, JobsNameAModelByNameOrDigestAndAnUnknownOneIsRefused) {
  StartModels();
  const std::string old_bytes = TinyGguf(10'000, 'a');
  const std::string new_bytes = TinyGguf(20'000, 'b');
  v1::Model old_model = MustPush("tiny", old_bytes);
  fake_clock_.Advance(absl::Seconds(1));
  v1::Model new_model = MustPush("tiny", new_bytes);

  // By name: the newest bytes of that name, with what a task needs.
  v1::Job job;
  ASSERT_GRPC_OK(jobs_->SubmitJob(Context(&submitter_).get(), ModelRequest("tiny"), &job));
  EXPECT_EQ(job.model(), "tiny");
  EXPECT_EQ(job.model_digest(), new_model.digest());
  EXPECT_EQ(job.runner(), "llama");
  EXPECT_EQ(job.memory_bytes(), new_model.memory_bytes());  // the default runner options
  // By digest: those bytes.
  v1::Job pinned;
  ASSERT_GRPC_OK(jobs_->SubmitJob(Context(&submitter_).get(), ModelRequest("tiny@" + old_model.digest()), &pinned));
  EXPECT_EQ(pinned.model_digest(), old_model.digest());
  // Options that need more memory raise the estimate; a submitter's larger floor wins.
  v1::SubmitJobRequest bigger = ModelRequest("tiny");
  bigger.set_runner_options_json("{\"n_parallel\": 64, \"n_ctx_per_seq\": 2048}");
  v1::Job big;
  ASSERT_GRPC_OK(jobs_->SubmitJob(Context(&submitter_).get(), bigger, &big));
  EXPECT_GT(big.memory_bytes(), job.memory_bytes());
  bigger.set_min_memory_bytes(int64_t{1} << 40);
  ASSERT_GRPC_OK(jobs_->SubmitJob(Context(&submitter_).get(), bigger, &big));
  EXPECT_EQ(big.memory_bytes(), int64_t{1} << 40);

  // Unknown names and digests are refused, naming the team's models.
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(Context(&submitter_).get(), ModelRequest("llama-8b"), &job), INVALID_ARGUMENT,
                    "its models: tiny");
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(Context(&submitter_).get(), ModelRequest("tiny@" + DigestOf("x")), &job),
                    INVALID_ARGUMENT, "has no model");
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(Context(&submitter_).get(), ModelRequest("bad name"), &job), INVALID_ARGUMENT,
                    "not a model name");
  v1::SubmitJobRequest runner = ModelRequest("tiny");
  runner.set_runner("../sh");
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(Context(&submitter_).get(), runner, &job), INVALID_ARGUMENT, "runner name");
  runner.set_runner("mlx");
  ASSERT_GRPC_OK(jobs_->SubmitJob(Context(&submitter_).get(), runner, &job));
  EXPECT_EQ(job.runner(), "mlx");
}

TEST_F(ModelServiceTest, RemovingAModelAJobNeedsIsRefusedUntilTheJobEnds) {
  StartModels();
  const std::string bytes = TinyGguf(10'000);
  v1::Model model = MustPush("tiny", bytes);
  v1::Job job;
  ASSERT_GRPC_OK(jobs_->SubmitJob(Context(&submitter_).get(), ModelRequest("tiny"), &job));

  v1::RemoveModelRequest rm;
  rm.set_model("tiny");
  v1::RemoveModelResponse removed;
  EXPECT_GRPC_ERROR(models_->RemoveModel(Context(&submitter_).get(), rm, &removed), FAILED_PRECONDITION, job.id());
  // A lease of the job carries the model's digest, size and a URL to fetch it from. The executor
  // holds no model, so it gets the job once the warm-executor wait is over (delay scheduling).
  const std::string executor = RegisterExecutor("e1");
  fake_clock_.Advance(StoreOptions{}.warm_wait);
  v1::LeaseRequest lease;
  lease.set_executor_id(executor);
  lease.set_max_tasks(1);
  v1::LeaseResponse leased;
  ASSERT_GRPC_OK(executors_->Lease(ExecutorContext(executor).get(), lease, &leased));
  ASSERT_THAT(leased.leases(), SizeIs(1));
  EXPECT_EQ(leased.leases(0).model_digest(), model.digest());
  EXPECT_EQ(leased.leases(0).model_size_bytes(), model.size_bytes());
  EXPECT_FALSE(leased.leases(0).model_url().empty());
  EXPECT_EQ(leased.leases(0).model(), "tiny");

  v1::Job cancelled;
  ASSERT_GRPC_OK(jobs_->CancelJob(Context(&submitter_).get(), [&] {
    v1::CancelJobRequest r;
    r.set_job_id(job.id());
    return r;
  }(), &cancelled));
  ASSERT_GRPC_OK(models_->RemoveModel(Context(&submitter_).get(), rm, &removed));
  ASSERT_THAT(removed.removed(), SizeIs(1));
  // The bytes went with the last name that carried them.
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> stored, blobs_->List("models/"));
  EXPECT_THAT(stored, SizeIs(0));
}

}  // namespace
}  // namespace minions::testing

namespace minions::testing {
namespace {

// `minions status JOB` says why a queued job waits (GetJob's wait_cause and wait_reason), from
// the lease's own placement rules: a cold executor within the warm-executor wait, then in line,
// then nothing once its task runs.
TEST_F(ModelServiceTest, GetJobSaysWhyAQueuedJobWaits) {
  StartModels();
  MustPush("tiny", TinyGguf(10'000));
  v1::Job job;
  ASSERT_GRPC_OK(jobs_->SubmitJob(Context(&submitter_).get(), ModelRequest("tiny"), &job));
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  v1::Job read;
  ASSERT_GRPC_OK(jobs_->GetJob(Context(&viewer_).get(), get, &read));
  EXPECT_EQ(read.wait_cause(), "no_executors");

  const std::string executor = RegisterExecutor("e1");  // holds no model: cold
  ASSERT_GRPC_OK(jobs_->GetJob(Context(&viewer_).get(), get, &read));
  EXPECT_EQ(read.wait_cause(), "warm_wait") << read.wait_reason();
  EXPECT_THAT(read.wait_reason(), ::testing::HasSubstr("tiny"));
  v1::LeaseResponse leased;
  ASSERT_GRPC_OK(Lease(executor, 1, &leased));
  EXPECT_THAT(leased.leases(), SizeIs(0));  // what the status said: the lease agrees

  // After the wait (and the executor's idle recheck: it asked and got nothing, so the server looks
  // again for it once that has passed or work is announced), the cold executor takes it.
  fake_clock_.Advance(std::max(StoreOptions{}.warm_wait, Options().idle_recheck));
  ASSERT_GRPC_OK(jobs_->GetJob(Context(&viewer_).get(), get, &read));
  EXPECT_EQ(read.wait_cause(), "in_line") << read.wait_reason();
  ASSERT_GRPC_OK(Lease(executor, 8, &leased));
  EXPECT_THAT(leased.leases(), SizeIs(1));
  ASSERT_GRPC_OK(jobs_->GetJob(Context(&viewer_).get(), get, &read));
  EXPECT_EQ(read.wait_cause(), "");  // nothing pending: it runs
  EXPECT_EQ(read.wait_reason(), "");

}

// A cold executor waits no longer than the warm-executor wait: having found nothing while the
// job's wait ran, it is looked up again when the wait ends (within its 100 ms rounding), not only
// at its idle recheck (30 s); a long poll held meanwhile is answered then too.
TEST_F(ModelServiceTest, AColdExecutorIsServedWhenTheWarmWaitEndsNotAtItsIdleRecheck) {
  StartModels();
  MustPush("tiny", TinyGguf(10'000));
  const std::string executor = RegisterExecutor("e1");  // holds no model: cold
  v1::Job job;
  ASSERT_GRPC_OK(jobs_->SubmitJob(Context(&submitter_).get(), ModelRequest("tiny"), &job));
  v1::LeaseResponse leased;
  ASSERT_GRPC_OK(Lease(executor, 1, &leased));
  EXPECT_THAT(leased.leases(), SizeIs(0));  // within the wait
  ASSERT_LT(StoreOptions{}.warm_wait + absl::Milliseconds(100), Options().idle_recheck);
  fake_clock_.Advance(StoreOptions{}.warm_wait + absl::Milliseconds(100));
  ASSERT_GRPC_OK(Lease(executor, 8, &leased));
  EXPECT_THAT(leased.leases(), SizeIs(1));
}

}  // namespace
}  // namespace minions::testing

namespace minions::testing {
namespace {

// A team cannot fill the object store with abandoned pushes: a new push beyond
// max_unfinished_model_pushes is refused (a part sent without a start too), one under way goes
// on, another team is not held back, and a push untouched for the TTL is removed, which frees
// its place.
TEST_F(ModelServiceTest, UnfinishedPushesAreCappedPerTeamAndExpire) {
  ServerOptions options = Options();
  options.max_unfinished_model_pushes = 2;
  options.unfinished_model_push_ttl = absl::Hours(1);
  options.model_part_bytes = 1 << 20;
  StartServer(&fake_clock_, options);
  models_ = v1::Models::NewStub(rpc::MakeChannel(server_->address()));
  for (const char* name : {"search", "ads"}) {
    Team team;
    team.name = name;
    team.created_at = fake_clock_.Now();
    ASSERT_OK(store_->CreateTeam(team));
  }
  submitter_ = Issue(Role::kSubmitter, "search", "alice");
  const std::string ads = Issue(Role::kSubmitter, "ads", "carol");
  const int64_t part = 1 << 20;
  const std::string a = TinyGguf(1'500'000, 'a'), b = TinyGguf(1'500'000, 'b'), c = TinyGguf(1'500'000, 'c');
  ASSERT_NE(DigestOf(a), DigestOf(b));
  ASSERT_NE(DigestOf(b), DigestOf(c));
  // Two pushes left half done.
  ASSERT_GRPC_OK(Upload(submitter_, a, 1, part));
  fake_clock_.Advance(absl::Minutes(30));
  v1::StartModelPushResponse started;
  ASSERT_GRPC_OK(Start(submitter_, "b", b, &started));
  ASSERT_GRPC_OK(Upload(submitter_, b, 1, part));
  // A third is refused, by its start and by a part sent without one; nothing of it is stored.
  EXPECT_GRPC_ERROR(Start(submitter_, "c", c, &started), RESOURCE_EXHAUSTED, "2 unfinished model pushes");
  EXPECT_GRPC_ERROR(Upload(submitter_, c, 1, part), RESOURCE_EXHAUSTED, "at most 2");
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> stored, blobs_->List("model-uploads/search/"));
  for (const std::string& key : stored) EXPECT_EQ(key.find(std::string(DigestHex(DigestOf(c)))), std::string::npos);
  // The ones under way go on; another team has places of its own.
  ASSERT_GRPC_OK(Upload(submitter_, b, 2, part));
  ASSERT_GRPC_OK(Upload(ads, c, 1, part));
  // An hour after a's last part (b was touched since), a is removed and c may start.
  fake_clock_.Advance(absl::Minutes(31));
  ASSERT_GRPC_OK(Start(submitter_, "c", c, &started));
  EXPECT_THAT(started.parts_present(), SizeIs(0));
  ASSERT_OK_AND_ASSIGN(stored, blobs_->List(keys::ModelUploadPrefix("search", std::string(DigestHex(DigestOf(a))),
                                                                    static_cast<int64_t>(a.size()))));
  EXPECT_THAT(stored, SizeIs(0));
  // A finished push frees its place: b completes, and a new push of a fits again.
  v1::Model model;
  ASSERT_GRPC_OK(Finish(submitter_, "b", b, &model));
  ASSERT_GRPC_OK(Start(submitter_, "a", a, &started));
}

}  // namespace
}  // namespace minions::testing
