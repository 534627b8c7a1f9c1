#pragma once
// OpenAiApi: the OpenAI Batch API on the server's HTTP port, a second door to the same jobs, so a
// script written for OpenAI runs on Minions by changing its base URL and key:
//   /v1/files (upload, list, retrieve, content, delete), /v1/batches (create, retrieve, list,
//   cancel) and /v1/models (list, retrieve), with OpenAI's shapes, status codes and error object
//   ({"error": {"message", "type", "param", "code"}}).
//
// - Callers present "Authorization: Bearer <token>": a team's submitter creates and deletes, a
//   viewer only reads; another team's file or batch is 404, word for word as an unknown one.
//   The key is checked from the headers, before the request holds anything (Admit); only
//   uploads, downloads and batch creation take a stream slot, counted against the key's
//   principal, so that one submitter's slow uploads leave other teams served.
// - A file is an object under its team's prefix (keys::OpenAiFiles), uploaded as it arrives (the
//   object store's multipart upload) and downloaded as it is read: never held whole.
// - A batch is a job (JobService::Submit, with the team and principal of the key), so it shows in
//   the CLI, the dashboard and the metrics; its id is the job's. Its output and error files are
//   the job's merged files ("file-<job>-output", "file-<job>-errors"). What the job row lacks
//   (endpoint, input file, metadata, validation errors) is kept beside it (keys::OpenAiBatch).
// - Validation happens in the create call: a file whose lines are malformed, name another
//   endpoint, repeat a custom_id, or name more than one model (as OpenAI refuses) or a model the
//   catalog does not have makes a `failed` batch whose `errors` give line numbers and messages.
// - Idempotency-Key on create: a retry with the same key (per team) returns the first batch.
// - Validation reads the file as a stream and keeps a 128-bit fingerprint per custom_id (not the
//   id), and no lock is held across creates but the one of their own Idempotency-Key.
//
// Ownership: borrows everything it is given. Threads: Serve runs on the HTTP server's stream
// threads, several at once; thread-safe.

#include <optional>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "blob/blob_store.h"
#include "common/clock.h"
#include "common/json_util.h"
#include "http/http_server.h"
#include "identity/authenticator.h"
#include "openai/model_catalog.h"
#include "server/job_finalizer.h"
#include "server/job_service.h"
#include "store/metadata_store.h"

namespace minions::openai {

class BatchInputCheck;

struct OpenAiApiOptions {
  int64_t max_file_bytes = int64_t{256} << 20;  // the largest upload
  int64_t max_json_bytes = 1 << 20;             // the largest JSON request body
  int64_t max_listed_jobs = 10000;              // the newest jobs a batch list pages through
  int max_errors = 100;                         // validation errors kept per batch
};

class OpenAiApi {
 public:
  struct Deps {
    MetadataStore* store;
    BlobStore* blobs;
    Clock* clock;
    Authenticator* auth;
    JobService* jobs;
    ModelCatalog* models;
    ChunkCheckOptions chunk_limits;
  };
  OpenAiApi(Deps deps, OpenAiApiOptions options);

  // Serves every path under /v1/ on `http` (streamed routes, with Admit as their admission).
  // Before http->Start.
  void Install(HttpServer* http);
  // Before any slot is taken: refuses a request without a valid key for its method; says which
  // requests are bulk (uploads, downloads, batch creation: a stream slot of the key's principal)
  // and which small (JSON in and out, on a worker, no slot).
  HttpAdmission Admit(const HttpRequest& request);
  void Serve(const HttpRequest& request, HttpStream& stream);

 private:
  struct Call;
  // The caller of `request` for its method's scope, or the error (and *refusal, OpenAI's answer).
  absl::StatusOr<Caller> Authorize(const HttpRequest& request, HttpResponse* refusal);
  void Route(Call& call);
  void CreateFile(Call& call);
  void ListFiles(Call& call);
  void GetFile(Call& call, const std::string& id);
  void FileContent(Call& call, const std::string& id);
  void DeleteFile(Call& call, const std::string& id);
  void CreateBatch(Call& call);
  // POST /v1/batches's parts: the request's fields, checked (nullopt: the call was answered), and
  // the job the checked input file becomes (a failed one when the check found errors).
  struct BatchRequest;
  std::optional<BatchRequest> ReadBatchRequest(Call& call);
  absl::StatusOr<Job> SubmitBatch(Call& call, const BatchRequest& request, const std::string& input_key,
                                  BatchInputCheck& check);
  void ListBatches(Call& call);
  void GetBatch(Call& call, const std::string& id);
  void CancelBatch(Call& call, const std::string& id);
  void ListModels(Call& call);
  void GetModel(Call& call, const std::string& id);

  // The batch object of a job the caller may see (a cancelled job's partial results merged).
  absl::StatusOr<Json> BatchObject(const Job& job);
  // A batch's output or error file, when the caller may see the batch and the batch names it.
  struct ResultFile {
    Job job;
    bool errors = false;  // the error file (else the output)
    std::string key;      // its object
  };
  absl::StatusOr<ResultFile> FindResultFile(Call& call, const std::string& id);

  Deps deps_;
  OpenAiApiOptions options_;
  JobFinalizer finalizer_;       // merges a cancelled batch's partial results
  // Creates holding an Idempotency-Key: one at a time per key (per team) in this process, and
  // creates with other keys (or none) never wait for them.
  void HoldIdempotencyKey(const std::string& key) ABSL_LOCKS_EXCLUDED(idempotency_mu_);
  void ReleaseIdempotencyKey(const std::string& key) ABSL_LOCKS_EXCLUDED(idempotency_mu_);
  absl::Mutex idempotency_mu_;
  absl::CondVar idempotency_released_;
  absl::flat_hash_set<std::string> creating_ ABSL_GUARDED_BY(idempotency_mu_);
};

}  // namespace minions::openai
