#pragma once
// What the server sends and takes for spot checks (docs/verification.md, "Spot checks"): a
// verification task's records as the verifier re-scores them (each drawn record's input line and
// the line its producer wrote), read from the object store, so the verifier trusts nothing the
// producer says about which record is which.
// Threads: free functions; thread-safe as the BlobStore is.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "blob/blob_store.h"
#include "minions/v1/minions.pb.h"
#include "model/types.h"
#include "model/verification.h"

namespace minions {

// The records of `check` (a verification task of `task`'s chunk), in its order: each one's
// custom_id and input line from the task's input (`input_key`), and the line of the chunk's
// output or errors that answers it (matched in record order, as the chunk check matched them).
// FailedPrecondition when the task no longer holds that chunk (its records are being redone),
// unless `check` is an arbitration, which names the chunk's records itself;
// DataLoss when the objects do not hold what the committed chunk says; the object store's error
// (Unavailable) when it cannot be read. `max_chunk_bytes` bounds each chunk object read.
absl::StatusOr<std::vector<v1::VerificationItem>> ReadVerificationItems(BlobStore& blobs, const std::string& input_key,
                                                                        const Task& task,
                                                                        const VerificationTask& check,
                                                                        int64_t max_chunk_bytes);

// Fills `out` with `check` as leased: its chunk, its items, and the job's model and runner as
// `job` (a Lease made of the task and its job, model/types.h MakeLease) names them, with a model
// URL valid for `url_ttl` when the model comes from the registry.
absl::Status FillVerificationLease(BlobStore& blobs, absl::Duration url_ttl, const Lease& job,
                                   const VerificationTask& check, std::vector<v1::VerificationItem> items,
                                   v1::VerificationLease& out);

// The key of the chunk `ref` names (job, task, attempt, seq) as the store takes it.
VerificationTask VerificationKey(const v1::VerificationRef& ref);

}  // namespace minions
