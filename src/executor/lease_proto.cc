#include "executor/lease_proto.h"

namespace minions {

LeaseGrant FromProto(const v1::TaskLease& lease) {
  LeaseGrant grant;
  grant.ref = FromProto(lease.ref());
  grant.first_record = lease.first_record();
  grant.n_records = lease.n_records();
  grant.input_url = lease.input_url();
  grant.byte_begin = lease.byte_begin();
  grant.byte_end = lease.byte_end();
  grant.model = lease.model();
  grant.model_digest = lease.model_digest();
  grant.model_size_bytes = lease.model_size_bytes();
  grant.model_url = lease.model_url();
  grant.runner = lease.runner();
  grant.runner_options_json = lease.runner_options_json();
  grant.expires_at = absl::FromUnixMillis(lease.lease_expires_at_ms());
  grant.resume_from = lease.resume_from();
  for (const auto& urls : lease.chunk_urls()) grant.chunk_urls.push_back({urls.output_url(), urls.errors_url()});
  for (const auto& peer : lease.gang()) grant.gang.push_back({peer.endpoint(), peer.bytes()});
  grant.gang_leader_bytes = lease.gang_leader_bytes();
  grant.gang_secret = lease.gang_secret();
  return grant;
}

GangDuty FromProto(const v1::GangDuty& duty) {
  return {FromProto(duty.ref()), duty.leader_host(), duty.bind(), duty.secret()};
}

AttemptRef FromProto(const v1::LeaseRef& ref) { return {ref.job_id(), ref.task_index(), ref.attempt()}; }

void ToProto(const LeaseProgress& progress, v1::LeaseRef* ref) {
  ref->set_job_id(progress.job_id);
  ref->set_task_index(progress.task_index);
  ref->set_attempt(progress.attempt);
  ref->set_records_done(progress.records_done);
  ref->set_records_failed(progress.records_failed);
  for (const Chunk& chunk : progress.chunks) {
    v1::Chunk* out = ref->add_chunks();
    out->set_attempt(chunk.attempt);
    out->set_seq(chunk.seq);
    out->set_begin(chunk.begin);
    out->set_end(chunk.end);
    out->set_records_failed(chunk.records_failed);
  }
}

}  // namespace minions
