#include "server/proto_convert.h"

#include "common/host_port.h"
#include "model/memory_estimate.h"

namespace minions {

int64_t MillisOrZero(const std::optional<absl::Time>& t) { return t ? absl::ToUnixMillis(*t) : 0; }

v1::Job ToProto(const Job& job) {
  v1::Job p;
  p.set_id(job.id);
  p.set_state(std::string(JobStateName(job.state)));
  p.set_team(job.spec.team);
  p.set_model(job.spec.model);
  p.mutable_request_counts()->set_total(job.counts.total);
  p.mutable_request_counts()->set_completed(job.counts.completed);
  p.mutable_request_counts()->set_failed(job.counts.failed);
  p.set_n_tasks(job.n_tasks);
  p.set_tasks_done(job.tasks_done);
  p.set_error(job.error);
  p.set_created_at_ms(absl::ToUnixMillis(job.created_at));
  p.set_started_at_ms(MillisOrZero(job.started_at));
  p.set_finished_at_ms(MillisOrZero(job.finished_at));
  p.set_device_seconds(absl::ToDoubleSeconds(job.device_time));
  if (job.tokens) {
    p.set_prompt_tokens(job.tokens->prompt_tokens);
    p.set_completion_tokens(job.tokens->completion_tokens);
    p.set_reasoning_tokens(job.tokens->reasoning_tokens);
  }
  p.set_output_key(job.output_key);
  p.set_errors_key(job.errors_key);
  p.set_manifest_key(job.manifest_key);
  p.set_shard_size(job.spec.shard_size);
  p.set_priority(job.spec.priority);
  p.set_max_attempts(job.spec.max_attempts);
  p.set_owner(job.spec.owner);
  p.set_model_digest(job.spec.model_digest);
  p.set_runner(job.spec.requirements.runner);
  p.set_memory_bytes(job.spec.requirements.min_memory_bytes);
  p.set_gang_size(job.spec.gang_size);
  p.set_require_confined(job.spec.requirements.confined);
  p.set_sizing(job.spec.sizing);
  p.set_tokens_per_record(job.spec.tokens_per_record);
  return p;
}

v1::Task ToProto(const Task& task) {
  v1::Task p;
  p.set_job_id(task.job_id);
  p.set_index(task.index);
  p.set_state(std::string(TaskStateName(task.state)));
  p.set_attempt(task.attempt);
  p.set_failures(task.failures);
  p.set_preemptions(task.preemptions);
  p.set_executor_id(task.executor_id);
  p.set_first_record(task.first_record);
  p.set_n_records(task.n_records);
  p.set_records_done(task.records_done);
  p.set_records_failed(task.records_failed);
  p.set_records_committed(CommittedRecords(task));
  for (const Chunk& c : task.chunks) {
    v1::Chunk* chunk = p.add_chunks();
    chunk->set_attempt(c.attempt);
    chunk->set_seq(c.seq);
    chunk->set_begin(c.begin);
    chunk->set_end(c.end);
    chunk->set_records_failed(c.records_failed);
  }
  p.set_last_error(task.last_error);
  p.set_lease_expires_at_ms(MillisOrZero(task.lease_expires_at));
  return p;
}

v1::Executor ToProto(const Executor& e) {
  v1::Executor p;
  p.set_id(e.id);
  p.set_name(e.info.name);
  p.set_state(std::string(ExecutorStateShown(e.state)));
  // The server's own reasons only: an owner's presence is never explained.
  if (e.state != ExecutorState::kOwnerActive) p.set_state_reason(e.state_reason);
  p.set_os(e.info.os);
  p.set_chip(e.info.chip);
  p.set_memory_bytes(e.info.memory_bytes);
  p.set_gpu(e.info.gpu);
  p.set_accelerator(e.info.accelerator);
  p.set_usable_memory_bytes(UsableMemory(e.info));
  for (const std::string& runner : e.info.runners) p.add_runners(runner);
  for (const std::string& digest : e.info.models) p.add_models_cached(digest);
  p.set_model_loaded(e.info.model_loaded);
  p.set_confinement(e.info.confinement);
  p.set_last_heartbeat_at_ms(absl::ToUnixMillis(e.last_heartbeat_at));
  p.set_registered_at_ms(absl::ToUnixMillis(e.registered_at));
  p.set_records_done(e.records_done);
  return p;
}

ExecutorInfo FromProto(const v1::Capabilities& c) {
  ExecutorInfo info;
  info.name = c.name();
  info.os = c.os();
  info.chip = c.chip();
  info.memory_bytes = c.memory_bytes();
  info.gpu = c.gpu();
  info.accelerator = c.accelerator().empty() ? kAcceleratorCpu : c.accelerator();
  info.usable_memory_bytes = c.usable_memory_bytes();
  info.model_loaded = c.model_loaded();
  info.runners.assign(c.runners().begin(), c.runners().end());
  info.models.assign(c.models().begin(), c.models().end());
  info.max_tasks = c.max_tasks() > 0 ? c.max_tasks() : 1;
  info.version = c.version();
  // Only a well-formed host:port joins gangs (leaders' runners connect there).
  std::string host;
  int port = 0;
  if (!c.gang_address().empty() && c.gang_address().size() <= 300 && SplitHostPort(c.gang_address(), &host, &port).ok() &&
      !host.empty() && host != "0.0.0.0" && host != "::" && port > 0) {
    info.gang_address = c.gang_address();
  }
  // One of the known words only: anything else is unknown (not confined).
  if (c.confinement() == kConfinementFull || c.confinement() == kConfinementPartial ||
      c.confinement() == kConfinementNone) {
    info.confinement = c.confinement();
  }
  // Model folders: absolute paths only, bounded in number and size (the row keeps them).
  for (const std::string& folder : c.model_folders()) {
    if (info.model_folders.size() >= 32) break;
    if (folder.empty() || folder[0] != '/' || folder.size() > 4096 || folder.find('\0') != std::string::npos) continue;
    info.model_folders.push_back(folder);
  }
  return info;
}

ModelHoldings FromProto(const v1::ModelHoldings& p) {
  ModelHoldings holdings;
  holdings.cached.assign(p.cached().begin(), p.cached().end());
  holdings.loaded = p.loaded();
  return holdings;
}

v1::Model ToProto(const ModelRecord& model) {
  v1::Model p;
  p.set_team(model.team);
  p.set_name(model.name);
  p.set_digest(model.digest);
  p.set_size_bytes(model.size_bytes);
  p.set_format(model.facts.format);
  p.set_architecture(model.facts.architecture);
  p.set_parameters(model.facts.parameters);
  p.set_quantization(model.facts.quantization);
  p.set_context_length(model.facts.context_length);
  p.set_layers(model.facts.layers);
  p.set_embedding_size(model.facts.embedding_size);
  p.set_heads(model.facts.heads);
  p.set_kv_heads(model.facts.kv_heads);
  p.set_head_dim(model.facts.head_dim);
  p.set_vocab_size(model.facts.vocab_size);
  p.set_created_by(model.created_by);
  p.set_created_at_ms(absl::ToUnixMillis(model.created_at));
  p.set_memory_bytes(EstimateTaskMemory(model.size_bytes, model.facts, MemoryEstimateOptions{}));
  return p;
}

v1::Team ToProto(const Team& team) {
  v1::Team p;
  p.set_name(team.name);
  p.set_max_priority(team.max_priority);
  p.set_max_active_jobs(team.max_active_jobs);
  p.set_requests_per_second(team.requests_per_second);
  p.set_created_at_ms(absl::ToUnixMillis(team.created_at));
  p.set_weight(team.weight);
  p.set_max_running_tasks(team.max_running_tasks);
  p.set_max_file_bytes(team.max_file_bytes);
  p.set_max_model_bytes(team.max_model_bytes);
  p.set_max_result_bytes(team.max_result_bytes);
  p.set_file_bytes(team.file_bytes);
  p.set_result_bytes(team.result_bytes);
  for (const std::string& runner : team.runners) p.add_runners(runner);
  p.set_require_confined(team.require_confined);
  p.set_verify_fraction(team.verify_fraction);
  return p;
}

Team FromProto(const v1::Team& p) {
  Team team;
  team.name = p.name();
  team.max_priority = p.max_priority();
  team.max_active_jobs = p.max_active_jobs();
  team.requests_per_second = p.requests_per_second();
  team.weight = p.weight() == 0 ? 1 : p.weight();  // unset: the default
  team.max_running_tasks = p.max_running_tasks();
  team.max_file_bytes = p.max_file_bytes();
  team.max_model_bytes = p.max_model_bytes();
  team.max_result_bytes = p.max_result_bytes();
  team.runners.assign(p.runners().begin(), p.runners().end());
  team.require_confined = p.require_confined();
  team.verify_fraction = p.verify_fraction();
  return team;
}

v1::VerificationCounts ToProto(const VerificationTally& tally) {
  v1::VerificationCounts p;
  p.set_checked(tally.checked);
  p.set_passed(tally.passed);
  p.set_failed(tally.failed);
  for (const std::string& verifier : tally.verifiers) p.add_verifiers(verifier);
  return p;
}

v1::TokenInfo ToProto(const TokenRecord& token) {
  v1::TokenInfo p;
  p.set_id(token.id);
  p.set_role(std::string(RoleName(token.role)));
  p.set_team(token.team);
  p.set_principal(token.principal);
  p.set_scopes(ScopesToString(token.scopes));
  p.set_uses_left(token.uses_left);
  p.set_created_by(token.created_by);
  p.set_created_at_ms(absl::ToUnixMillis(token.created_at));
  p.set_expires_at_ms(MillisOrZero(token.expires_at));
  p.set_last_used_at_ms(MillisOrZero(token.last_used_at));
  p.set_revoked_at_ms(MillisOrZero(token.revoked_at));
  return p;
}

}  // namespace minions
