#include "server/lease_answer.h"

#include <algorithm>
#include <set>
#include <string>
#include <tuple>

#include "common/json_util.h"
#include "common/logging.h"
#include "model/model_ref.h"
#include "model/state_machines.h"
#include "server/keys.h"

namespace minions {
namespace {

// The lease's input URL and one write URL pair per chunk the attempt may upload.
absl::Status FillObjectUrls(BlobStore& blobs, absl::Duration url_ttl, const Lease& lease, v1::TaskLease& out) {
  const Task& t = lease.task;
  auto input = blobs.Url(lease.input_key, UrlAccess::kRead, url_ttl);
  if (!input.ok()) return input.status();
  out.set_input_url(*input);
  if (!lease.model_digest.empty()) {
    // Content-addressed under the job's team: the executor verifies the digest before loading.
    auto model =
        blobs.Url(keys::ModelBlob(lease.team, std::string(DigestHex(lease.model_digest))), UrlAccess::kRead, url_ttl);
    if (!model.ok()) return model.status();
    out.set_model_url(*model);
    out.set_model_digest(lease.model_digest);
    out.set_model_size_bytes(lease.model_size_bytes);
  }
  // One pair per chunk the attempt may write: a record per chunk at most, kMaxChunkUrls in all.
  const int first_seq = NextChunkSeq(t);
  const int64_t n_urls = std::clamp<int64_t>(t.n_records - CommittedRecords(t), 1, kMaxChunkUrls);
  for (int64_t k = 0; k < n_urls; ++k) {
    const int seq = first_seq + static_cast<int>(k);
    auto output = blobs.Url(keys::ChunkOutput(t.job_id, t.index, t.attempt, seq), UrlAccess::kWrite, url_ttl);
    if (!output.ok()) return output.status();
    auto errors = blobs.Url(keys::ChunkErrors(t.job_id, t.index, t.attempt, seq), UrlAccess::kWrite, url_ttl);
    if (!errors.ok()) return errors.status();
    v1::ChunkUrls* urls = out.add_chunk_urls();
    urls->set_output_url(*output);
    urls->set_errors_url(*errors);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FillTaskLease(BlobStore& blobs, absl::Duration url_ttl, const Lease& lease, v1::TaskLease& out) {
  if (absl::Status urls = FillObjectUrls(blobs, url_ttl, lease, out); !urls.ok()) return urls;
  const Task& t = lease.task;
  out.mutable_ref()->set_job_id(t.job_id);
  out.mutable_ref()->set_task_index(t.index);
  out.mutable_ref()->set_attempt(t.attempt);
  out.set_first_record(t.first_record);
  out.set_n_records(t.n_records);
  out.set_byte_begin(t.byte_begin);
  out.set_byte_end(t.byte_end);
  out.set_resume_from(CommittedRecords(t));
  out.set_model(lease.job_model);
  out.set_runner(lease.runner.empty() ? "llama" : lease.runner);
  out.set_runner_options_json(DumpJson(lease.runner_options));
  out.set_lease_expires_at_ms(absl::ToUnixMillis(lease.expires_at));
  if (!lease.gang.empty()) {
    // It leads a gang: its members' rpc gates (seat order) and what each lends.
    out.set_gang_leader_bytes(lease.gang.front().bytes);
    out.set_gang_secret(lease.gang_secret);
    for (size_t i = 1; i < lease.gang.size(); ++i) {
      v1::GangPeer* peer = out.add_gang();
      peer->set_endpoint(lease.gang[i].endpoint);
      peer->set_bytes(lease.gang[i].bytes);
    }
  }
  return absl::OkStatus();
}

void FillGangDuty(const GangDuty& duty, v1::GangDuty& out) {
  out.mutable_ref()->set_job_id(duty.ref.job_id);
  out.mutable_ref()->set_task_index(duty.ref.task_index);
  out.mutable_ref()->set_attempt(duty.ref.attempt);
  out.set_leader_host(duty.leader_host);
  out.set_bind(duty.bind);
  out.set_secret(duty.secret);
}

absl::StatusOr<std::vector<Lease>> ReclaimedLeases(MetadataStore& store, const std::string& executor_id,
                                                   const v1::LeaseRequest& request, absl::Time now) {
  std::vector<Lease> orphans;
  if (!request.reclaim()) return orphans;
  std::set<std::tuple<std::string, int64_t, int>> held;
  for (const auto& ref : request.held()) held.insert({ref.job_id(), ref.task_index(), ref.attempt()});
  // A rare call (only after a lost answer), so a scan of the running tasks is cheap enough.
  absl::StatusOr<std::vector<Task>> running = store.ListRunningTasks();
  if (!running.ok()) return running.status();
  for (Task& task : *running) {
    if (task.executor_id != executor_id || held.contains({task.job_id, task.index, task.attempt})) continue;
    if (task.lease_expires_at && *task.lease_expires_at <= now) continue;  // the watchdog's now
    absl::StatusOr<Job> job = store.GetJob(task.job_id);
    if (!job.ok()) continue;
    MINIONS_LOG(Info) << Describe(AttemptRef{task.job_id, task.index, task.attempt}) << " executor=" << executor_id
                      << " granted again: it never heard the answer that leased it";
    orphans.push_back(MakeLease(std::move(task), job->spec));
  }
  return orphans;
}

}  // namespace minions
