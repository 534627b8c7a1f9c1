// The ModelStore half of the store contract (see model_store.h): the model registry, and what an
// executor's heartbeat says it holds. Same fixture and instantiations as the MetadataStore
// contract, so every backend runs these stories too.

#include "model_store_contract.h"

namespace minions {

namespace {

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ModelStoreContract);

std::vector<std::string> Names(const std::vector<ModelRecord>& models) {
  std::vector<std::string> out;
  for (const ModelRecord& m : models) out.push_back(m.team + "/" + m.name + "@" + m.digest.substr(7, 1));
  return out;
}

TEST_P(ModelStoreContract, ModelsAreAddedFoundAndListedPerTeam) {
  ASSERT_OK_AND_ASSIGN(ModelRecord added, store_->AddModel(Model("search", "llama", 'a')));
  ASSERT_OK_AND_ASSIGN(ModelRecord read, store_->GetModel("search", "llama", Digest('a')));
  EXPECT_EQ(read.facts, added.facts);
  EXPECT_EQ(read.size_bytes, 1000);
  EXPECT_EQ(read.blob_key, added.blob_key);
  EXPECT_EQ(read.created_at, now_);

  // A second push of the same name and bytes changes nothing: the first row stays.
  Advance(absl::Minutes(1));
  ASSERT_OK_AND_ASSIGN(ModelRecord again, store_->AddModel(Model("search", "llama", 'a')));
  EXPECT_EQ(again.created_at, read.created_at);

  // New bytes under the name: the name alone means the newest.
  ASSERT_OK(store_->AddModel(Model("search", "llama", 'b')));
  ASSERT_OK_AND_ASSIGN(ModelRecord newest, store_->GetModel("search", "llama", ""));
  EXPECT_EQ(newest.digest, Digest('b'));
  // The bytes under another name, and by digest alone.
  ASSERT_OK(store_->AddModel(Model("search", "copy", 'a')));
  ASSERT_OK_AND_ASSIGN(ModelRecord by_digest, store_->GetModel("search", "", Digest('a')));
  EXPECT_EQ(by_digest.digest, Digest('a'));

  // Another team's models are its own.
  ASSERT_OK(store_->AddModel(Model("ads", "llama", 'c')));
  EXPECT_CODE(store_->GetModel("ads", "llama", Digest('a')), kNotFound);
  EXPECT_CODE(store_->GetModel("search", "", Digest('c')), kNotFound);
  EXPECT_CODE(store_->GetModel("search", "nothing", ""), kNotFound);

  ASSERT_OK_AND_ASSIGN(std::vector<ModelRecord> search, store_->ListModels("search"));
  EXPECT_THAT(Names(search), ElementsAre("search/copy@a", "search/llama@b", "search/llama@a"));
  ASSERT_OK_AND_ASSIGN(std::vector<ModelRecord> all, store_->ListModels(""));
  EXPECT_THAT(all, SizeIs(4));
}

TEST_P(ModelStoreContract, MalformedModelsAreRefused) {
  EXPECT_CODE(store_->AddModel(Model("search", "Bad Name", 'a')), kInvalidArgument);
  EXPECT_CODE(store_->AddModel(Model("search", "model.gguf", 'a')), kInvalidArgument);
  ModelRecord bad_digest = Model("search", "ok", 'a');
  bad_digest.digest = "sha256:ABC";
  EXPECT_CODE(store_->AddModel(bad_digest), kInvalidArgument);
  EXPECT_CODE(store_->AddModel(Model("", "ok", 'a')), kInvalidArgument);
  EXPECT_CODE(store_->AddModel(Model("search", "ok", 'a', 0)), kInvalidArgument);
  EXPECT_CODE(store_->GetModel("search", "", ""), kInvalidArgument);
  EXPECT_CODE(store_->GetModel("search", "x", "md5:00"), kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(std::vector<ModelRecord> models, store_->ListModels(""));
  EXPECT_THAT(models, IsEmpty());
}

TEST_P(ModelStoreContract, RemovalIsRefusedWhileAJobNeedsTheModel) {
  ASSERT_OK(store_->AddModel(Model("search", "llama", 'a')));
  ASSERT_OK(store_->AddModel(Model("search", "llama", 'b')));
  ASSERT_OK(store_->AddModel(Model("search", "copy", 'a')));
  JobSpec spec = Spec();
  spec.model = "llama";
  spec.model_digest = Digest('a');
  spec.model_size_bytes = 1000;
  const std::string job_id = Submit(spec, 2);

  absl::StatusOr<RemovedModels> refused = store_->RemoveModel("search", "llama", "");
  EXPECT_CODE(refused, kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr(job_id));
  EXPECT_CODE(store_->RemoveModel("search", "llama", Digest('a')), kFailedPrecondition);
  // Nothing was removed by the refusals.
  ASSERT_OK_AND_ASSIGN(std::vector<ModelRecord> models, store_->ListModels("search"));
  EXPECT_THAT(models, SizeIs(3));

  // Other bytes of the name, and the same bytes under another name, are not needed by the job.
  ASSERT_OK_AND_ASSIGN(RemovedModels removed, store_->RemoveModel("search", "llama", Digest('b')));
  EXPECT_THAT(Names(removed.removed), ElementsAre("search/llama@b"));
  EXPECT_THAT(removed.orphaned_digests, ElementsAre(Digest('b')));
  ASSERT_OK_AND_ASSIGN(removed, store_->RemoveModel("search", "copy", ""));
  EXPECT_THAT(removed.orphaned_digests, IsEmpty());  // llama@a still carries the bytes

  // Once the job has ended, the model may go; its bytes are orphaned.
  ASSERT_OK(store_->CancelJob(job_id, now_));
  ASSERT_OK_AND_ASSIGN(removed, store_->RemoveModel("search", "llama", ""));
  EXPECT_THAT(removed.orphaned_digests, ElementsAre(Digest('a')));
  EXPECT_CODE(store_->RemoveModel("search", "llama", ""), kNotFound);
}

TEST_P(ModelStoreContract, JobsKeepTheirModelAndEstimate) {
  JobSpec spec = Spec();
  spec.model = "llama";
  spec.model_digest = Digest('a');
  spec.model_size_bytes = 123;
  spec.requirements.estimate_bytes = 5 * kGiB;
  spec.requirements.min_memory_bytes = 5 * kGiB;
  spec.requirements.runner = "custom";
  const std::string job_id = Submit(spec, 1);
  Job job = GetJob(job_id);
  EXPECT_EQ(job.spec.model_digest, Digest('a'));
  EXPECT_EQ(job.spec.model_size_bytes, 123);
  EXPECT_EQ(job.spec.requirements.estimate_bytes, 5 * kGiB);

  // The lease carries what the executor needs to fetch and run it (an executor without the
  // model gets it once the warm-executor wait is over: StoreOptions::warm_wait).
  const std::string executor = Register("big", 16 * kGiB, {"custom"});
  Advance(StoreOptions{}.warm_wait);
  std::vector<Lease> leases = LeaseExactly(executor, 1);
  EXPECT_EQ(leases[0].model_digest, Digest('a'));
  EXPECT_EQ(leases[0].model_size_bytes, 123);
  EXPECT_EQ(leases[0].team, "search");
  EXPECT_EQ(leases[0].runner, "custom");
}

TEST_P(ModelStoreContract, HeartbeatsReportWhatAnExecutorHolds) {
  ExecutorInfo info;
  info.name = "mac";
  info.memory_bytes = 32 * kGiB;
  info.usable_memory_bytes = 24 * kGiB;
  info.accelerator = kAcceleratorMetal;
  info.gpu = "Apple M2 Max";
  info.runners = {"llama", "custom"};
  info.models = {Digest('a')};
  ASSERT_OK_AND_ASSIGN(Executor registered, store_->RegisterExecutor("", info, now_));
  Executor read = GetExecutor(registered.id);
  EXPECT_EQ(read.info.accelerator, kAcceleratorMetal);
  EXPECT_EQ(read.info.gpu, "Apple M2 Max");
  EXPECT_EQ(UsableMemory(read.info), 24 * kGiB);
  EXPECT_THAT(read.info.models, ElementsAre(Digest('a')));

  ModelHoldings holdings{{Digest('a'), Digest('b')}, Digest('b')};
  ASSERT_OK(store_->Heartbeat(registered.id, ExecutorState::kAvailable, "", {}, kTtl, now_, holdings));
  read = GetExecutor(registered.id);
  EXPECT_THAT(read.info.models, ElementsAre(Digest('a'), Digest('b')));
  EXPECT_EQ(read.info.model_loaded, Digest('b'));
  // A heartbeat that does not say leaves the holdings as they were.
  ASSERT_OK(store_->Heartbeat(registered.id, ExecutorState::kAvailable, "", {}, kTtl, now_));
  read = GetExecutor(registered.id);
  EXPECT_THAT(read.info.models, ElementsAre(Digest('a'), Digest('b')));
  EXPECT_EQ(read.info.model_loaded, Digest('b'));
  EXPECT_EQ(read.info.usable_memory_bytes, 24 * kGiB);
}

}  // namespace
}  // namespace minions
