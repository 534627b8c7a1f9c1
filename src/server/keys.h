#pragma once
// Where things live in the object store. Task outputs are written in chunks scoped by attempt: a
// stale attempt's late upload lands beside the winner's and is never read, because the store's
// committed chunks (and the manifest) name the attempt that wrote each.

#include <string>

#include "absl/strings/str_cat.h"

namespace minions::keys {

inline std::string JobInput(const std::string& job) { return absl::StrCat("jobs/", job, "/input.jsonl"); }
inline std::string TaskPrefix(const std::string& job, int64_t task) {
  return absl::StrCat("jobs/", job, "/tasks/", task, "/");
}
// A chunk's objects: scoped by attempt and chunk number, so a stale attempt's late upload lands
// beside the committed one and is never read (the task's committed chunks name their attempt).
inline std::string ChunkOutput(const std::string& job, int64_t task, int attempt, int seq) {
  return absl::StrCat(TaskPrefix(job, task), "attempt-", attempt, "/chunk-", seq, ".output.jsonl");
}
inline std::string ChunkErrors(const std::string& job, int64_t task, int attempt, int seq) {
  return absl::StrCat(TaskPrefix(job, task), "attempt-", attempt, "/chunk-", seq, ".errors.jsonl");
}
// A finished job's results, scoped by the finalisation that wrote them (`writer`, unique to each
// Finalize call): several servers may finalise one job at once, and the store's FinishJob names the
// winner's objects in the job's row; a loser writes beside them, never over them, so a reader of
// published results never meets them being rewritten (BlobStore's Put is atomic by contract, but
// the test S3 server, s3rver, truncates an object and rewrites it in place).
inline std::string JobOutput(const std::string& job, const std::string& writer) {
  return absl::StrCat("jobs/", job, "/results/", writer, "/output.jsonl");
}
inline std::string JobErrors(const std::string& job, const std::string& writer) {
  return absl::StrCat("jobs/", job, "/results/", writer, "/errors.jsonl");
}
inline std::string JobManifest(const std::string& job, const std::string& writer) {
  return absl::StrCat("jobs/", job, "/results/", writer, "/manifest.json");
}
// A cancelled job's partial results (JobFinalizer::MergeCancelled): its row names no keys.
inline std::string CancelledJobOutput(const std::string& job) {
  return absl::StrCat("jobs/", job, "/results/output.jsonl");
}
inline std::string CancelledJobErrors(const std::string& job) {
  return absl::StrCat("jobs/", job, "/results/errors.jsonl");
}
// A caller's own uploads (inline inputs are stored here too): a job's input named by key must lie
// under its submitter's prefix, so nobody can run another caller's objects as input and fetch
// them back as results. Team and principal names cannot hold '/' (model/identity.h).
inline std::string Uploads(const std::string& team, const std::string& principal) {
  return absl::StrCat("uploads/", team, "/", principal, "/");
}

// The OpenAI API's objects of a team (src/openai): its files (each beside a ".json" of what the
// Files API says of it), its batches' own fields (a batch is a job; these hold what the job row
// does not: endpoint, input file, metadata, validation errors) and its idempotency keys.
inline std::string OpenAiFiles(const std::string& team) { return absl::StrCat("openai/", team, "/files/"); }
inline std::string OpenAiBatch(const std::string& team, const std::string& job) {
  return absl::StrCat("openai/", team, "/batches/", job, ".json");
}
inline std::string OpenAiIdempotency(const std::string& team, const std::string& key_hash) {
  return absl::StrCat("openai/", team, "/idempotency/", key_hash);
}
// A team's model bytes, once per digest (hex, without "sha256:"): content-addressed under the team
// that owns them, so a second push of the same bytes is free and no team reads another's.
inline std::string ModelBlob(const std::string& team, const std::string& digest_hex) {
  return absl::StrCat("models/", team, "/sha256/", digest_hex);
}
// The parts of a push in progress, until FinishModelPush joins them into ModelBlob.
inline std::string ModelUploadPrefix(const std::string& team, const std::string& digest_hex, int64_t size) {
  return absl::StrCat("model-uploads/", team, "/", digest_hex, "-", size, "/");
}
// When a push in progress was last touched (its start, each part): unix microseconds, as text.
inline std::string ModelUploadMarker(const std::string& team, const std::string& digest_hex, int64_t size) {
  return absl::StrCat(ModelUploadPrefix(team, digest_hex, size), "touched");
}
// Every push in progress of a team.
inline std::string ModelUploadsOf(const std::string& team) { return absl::StrCat("model-uploads/", team, "/"); }
inline std::string ModelUploadPart(const std::string& team, const std::string& digest_hex, int64_t size, int part) {
  return absl::StrCat(ModelUploadPrefix(team, digest_hex, size), "part-", absl::Dec(part, absl::kZeroPad6));
}

}  // namespace minions::keys
