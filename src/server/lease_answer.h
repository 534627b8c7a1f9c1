#pragma once
// What a Lease call is answered: the TaskLease message of a granted Lease (it carries URLs for
// exactly the task's objects, so executors hold no object-store credentials), a gang member's
// duty, and the leases an executor asks for again after an answer it never heard.
// Threads: free functions; thread-safe as the BlobStore is.

#include "absl/status/status.h"
#include "absl/time/time.h"
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "blob/blob_store.h"
#include "minions/v1/minions.pb.h"
#include "model/types.h"
#include "server/gang_leasing.h"
#include "store/metadata_store.h"

namespace minions {

// Most chunk URL pairs one lease carries: an attempt that runs out writes the rest of its task as
// its last chunk (it checkpoints less often, and loses nothing).
inline constexpr int64_t kMaxChunkUrls = 32;

// Fills `out` with `lease`: its task's place in the input and where to resume, its model and
// runner, the gang it leads, and URLs valid for `url_ttl`: the input range's, the model's when it
// comes from the registry, and one write pair per chunk the attempt may upload. An error when a
// URL cannot be made (`out` is then partly filled and must not be sent).
absl::Status FillTaskLease(BlobStore& blobs, absl::Duration url_ttl, const Lease& lease, v1::TaskLease& out);
// A gang member's duty, as its lease answer carries it.
void FillGangDuty(const GangDuty& duty, v1::GangDuty& out);

// With `request.reclaim`: the store's current leases of `executor_id` that `request.held` does
// not name and that have not expired at `now` (granted by a call whose answer it never heard);
// else none.
absl::StatusOr<std::vector<Lease>> ReclaimedLeases(MetadataStore& store, const std::string& executor_id,
                                                   const v1::LeaseRequest& request, absl::Time now);

}  // namespace minions
