#include "server/spot_checks.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "model/model_ref.h"
#include "runner/batch_record.h"
#include "server/chunk_check.h"
#include "server/keys.h"

namespace minions {
namespace {

// The non-blank lines of a chunk object.
std::vector<std::string> ObjectLines(const std::string& data) { return SplitRecordLines(data); }

// A line's custom_id ("" when it has none or is not JSON).
std::string CustomIdOf(const std::string& line) {
  absl::StatusOr<Json> json = ParseJson(line);
  if (!json.ok() || !json->is_object()) return "";
  auto id = json->find("custom_id");
  return id != json->end() && id->is_string() ? id->get<std::string>() : "";
}

}  // namespace

absl::StatusOr<std::vector<v1::VerificationItem>> ReadVerificationItems(BlobStore& blobs, const std::string& input_key,
                                                                        const Task& task,
                                                                        const VerificationTask& check,
                                                                        int64_t max_chunk_bytes) {
  const Chunk* chunk = nullptr;
  for (const Chunk& c : task.chunks) {
    if (c.attempt == check.attempt && c.seq == check.seq) chunk = &c;
  }
  // An arbitration's chunk was redone (its producer quarantined): the task no longer holds it, but
  // its objects are kept, and the arbitration knows its records.
  const Chunk disputed{check.attempt, check.seq, check.chunk_begin, check.chunk_end, 0, check.producer_id};
  if (chunk == nullptr && !check.disputed_verifier.empty() && check.chunk_begin >= 0 &&
      check.chunk_begin < check.chunk_end && check.chunk_end <= task.n_records) {
    chunk = &disputed;
  }
  if (chunk == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("task ", task.job_id, "/", task.index, " no longer holds chunk ",
                                                      check.seq, " of attempt ", check.attempt));
  }
  auto input = blobs.GetRange(input_key, task.byte_begin, task.byte_end - task.byte_begin);
  if (!input.ok()) return input.status();
  const std::vector<std::string> records = SplitRecordLines(*input);
  if (static_cast<int64_t>(records.size()) != task.n_records) {
    return absl::DataLossError(absl::StrCat("the task's input holds ", records.size(), " records, not ", task.n_records));
  }
  auto output = ReadChunkObject(blobs, keys::ChunkOutput(task.job_id, task.index, chunk->attempt, chunk->seq),
                                max_chunk_bytes);
  if (!output.ok()) return output.status();
  auto errors = ReadChunkObject(blobs, keys::ChunkErrors(task.job_id, task.index, chunk->attempt, chunk->seq),
                                max_chunk_bytes);
  if (absl::IsNotFound(errors.status())) errors = std::string();
  if (!errors.ok()) return errors.status();
  const std::vector<std::string> outs = ObjectLines(*output), errs = ObjectLines(*errors);
  // Each record of the chunk, in order, is answered by the next output line or the next error
  // line (what VerifyChunk checked before the chunk committed).
  std::vector<v1::VerificationItem> items;
  size_t o = 0, e = 0, next = 0;
  for (int64_t r = chunk->begin; r < chunk->end && next < check.records.size(); ++r) {
    const std::string id = ParseRecordLine(records[static_cast<size_t>(r)]).custom_id;
    std::string line;
    if (o < outs.size() && CustomIdOf(outs[o]) == id) {
      line = outs[o++];
    } else if (e < errs.size() && CustomIdOf(errs[e]) == id) {
      line = errs[e++];
    } else {
      return absl::DataLossError(absl::StrCat("chunk ", chunk->seq, " of attempt ", chunk->attempt, " of task ",
                                              task.job_id, "/", task.index, " does not answer record ", r));
    }
    if (check.records[next] != r) continue;
    ++next;
    v1::VerificationItem& item = items.emplace_back();
    item.set_record(r);
    item.set_custom_id(id);
    item.set_input_line(records[static_cast<size_t>(r)]);
    item.set_output_line(std::move(line));
  }
  if (next != check.records.size()) {
    return absl::DataLossError(absl::StrCat("the verification task names records outside chunk ", chunk->seq));
  }
  return items;
}

absl::Status FillVerificationLease(BlobStore& blobs, absl::Duration url_ttl, const Lease& job,
                                   const VerificationTask& check, std::vector<v1::VerificationItem> items,
                                   v1::VerificationLease& out) {
  if (!job.model_digest.empty()) {
    auto model =
        blobs.Url(keys::ModelBlob(job.team, std::string(DigestHex(job.model_digest))), UrlAccess::kRead, url_ttl);
    if (!model.ok()) return model.status();
    out.set_model_url(*model);
    out.set_model_digest(job.model_digest);
    out.set_model_size_bytes(job.model_size_bytes);
  }
  out.mutable_ref()->set_job_id(check.job_id);
  out.mutable_ref()->set_task_index(check.task_index);
  out.mutable_ref()->set_attempt(check.attempt);
  out.mutable_ref()->set_seq(check.seq);
  for (v1::VerificationItem& item : items) *out.add_items() = std::move(item);
  out.set_model(job.job_model);
  out.set_runner(job.runner.empty() ? "llama" : job.runner);
  out.set_runner_options_json(DumpJson(job.runner_options));
  if (check.lease_expires_at) out.set_lease_expires_at_ms(absl::ToUnixMillis(*check.lease_expires_at));
  return absl::OkStatus();
}

VerificationTask VerificationKey(const v1::VerificationRef& ref) {
  return VerificationTask{ref.job_id(), ref.task_index(), ref.attempt(), ref.seq()};
}

}  // namespace minions
