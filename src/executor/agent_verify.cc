// ExecutorAgent, the verifier's side of spot checks (docs/verification.md, "Spot checks"): an
// idle executor leases a verification task (records of a chunk another executor produced), loads
// the job's model on its runner as it would for a task, has the runner re-score the claimed
// answers (`rescore`, docs/runner-protocol.md) and reports one verdict per record. Whatever it
// could not check (the model would not load, the runner died, the claimed line is not JSON) is
// reported as not checked, which says nothing about the producer.

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "executor/agent.h"

namespace minions {

void ExecutorAgent::Verify(bool may_ask, absl::Time now) {
  if (!verifying_) {
    // Only once a lease call came back empty: the server has no task for it now. Idle, or beside
    // tasks in hand (the check runs between them on the runner, and leasing goes on): a busy
    // executor whose queue ran dry takes the checks the job's other executors wait on, rather
    // than leaving them all for the job's end. At most every verify_poll; at once after a report
    // (more may wait), after its last task, or when the server woke its poll for one.
    if (!may_ask || !MayAskForChecks() || now < next_verify_ask_) return;
    next_verify_ask_ = now + options_.verify_poll;
    verify_due_ = false;
    ++verify_asks_;
    auto grants = client_->LeaseVerifications(id(), 1);
    if (!grants.ok()) {
      if (absl::IsUnimplemented(grants.status())) {
        // A server (or client) without spot checks: asking again will not change that.
        MINIONS_LOG(Info) << "the server leases no spot checks: " << grants.status().message();
        verify_unoffered_ = true;
      } else {
        MINIONS_LOG(Debug) << "leasing spot checks failed: " << grants.status().message();
      }
      return;
    }
    if (grants->empty()) {
      ++verify_asks_empty_;
      return;
    }
    Verifying v;
    v.since = now;
    v.grant = std::move(grants->front());
    v.batch = absl::StrCat("verify-", v.grant.job.ref.job_id, "-", v.grant.job.ref.task_index, "-",
                           v.grant.job.ref.attempt, "-", v.grant.seq);
    v.verdicts.resize(v.grant.items.size());
    verifying_ = std::move(v);
    // More than asked for: each goes back unchecked at once, so another verifier may take it.
    for (size_t i = 1; i < grants->size(); ++i) {
      std::vector<RecordVerdict> unchecked;
      for (const VerificationGrant::Item& item : (*grants)[i].items) {
        unchecked.push_back({item.record, item.custom_id, false, false, "not asked for"});
      }
      (void)client_->ReportVerifications(id(), (*grants)[i], unchecked);
    }
    MINIONS_LOG(Info) << "spot check of " << Describe(verifying_->grant.job.ref) << " chunk " << verifying_->grant.seq
                      << ": " << verifying_->grant.items.size() << " records";
  }
  Verifying& v = *verifying_;
  if (now >= v.grant.job.expires_at) return EndVerification("its lease expired before the verdicts came");
  if (v.sent) {
    if (!runner_.running() || runner_.generation() != v.runner_generation) return EndVerification("the runner ended");
    if (!v.done) return;
    EndVerification("the runner gave no verdict");
    // Straight on to the next one, if more wait: this pass would otherwise go on to a long poll
    // for tasks, and the spot checks waiting (and the jobs they hold back) with it.
    if (verifying_ || now < next_verify_ask_) return;
    return Verify(may_ask, now);
  }
  if (!may_ask) return;  // the owner holds the machine: no model loads for it meanwhile
  StartVerification(now);
}

void ExecutorAgent::StartVerification(absl::Time now) {
  Verifying& v = *verifying_;
  const std::string key = ModelKey(v.grant.job);
  if (runner_.Has(key) && (!v.load_asked || runner_.generation() == v.runner_generation)) {
    if (runner_.loading()) return;  // the runner says `loaded` (or why not)
    rescore::Request request;
    request.batch = v.batch;
    for (size_t i = 0; i < v.grant.items.size(); ++i) {
      const VerificationGrant::Item& item = v.grant.items[i];
      absl::StatusOr<Json> claimed = ParseJson(item.output_line);
      if (!claimed.ok() || !claimed->is_object()) {
        v.verdicts[i] = RecordVerdict{item.record, item.custom_id, false, false, "the claimed line is not a JSON object"};
        continue;
      }
      request.items.push_back({item.input_line, std::move(*claimed)});
      v.sent_items.push_back(i);
    }
    if (request.items.empty()) return EndVerification("nothing to re-score");
    runner_.StartRescore(request, now);
    v.sent = true;
    v.runner_generation = runner_.generation();
    return;
  }
  // Asked already and the runner no longer has (or loads) it: the load failed, the runner died, or
  // the owner took the machine back.
  if (v.load_asked) return EndVerification("the job's model did not load");
  // Another model: not while anything else runs or waits to (leasing is held back meanwhile).
  if (RunnerBusy() || runner_.loading() || !queue_.empty()) return;
  if (!v.grant.job.model_digest.empty()) {
    absl::StatusOr<std::optional<std::string>> cached = CachedModel(v.grant.job);
    if (!cached.ok()) return EndVerification(absl::StrCat("cannot fetch the model: ", cached.status().message()));
    if (!cached->has_value()) return;  // on its way; the fetch rings the loop when done
  }
  absl::StatusOr<runner_protocol::LoadRequest> load = LoadRequestFor(v.grant.job);
  if (!load.ok()) return EndVerification(absl::StrCat("cannot load the model: ", load.status().message()));
  if (runner_.running() && !runner_.Is(RunnerOf(v.grant.job), {})) DropRunner();  // holds nothing
  if (!runner_.running()) {
    if (absl::Status s = runner_.Start(RunnerOf(v.grant.job)); !s.ok()) {
      return EndVerification(absl::StrCat("cannot start the runner: ", s.message()));
    }
  }
  runner_.Load(*load, key, v.grant.job.model_digest.empty() ? v.grant.job.model : v.grant.job.model_digest, now);
  loading_for_ = nullptr;  // no task waits on it: a failure ends only the spot check
  v.load_asked = true;
  v.runner_generation = runner_.generation();
}

bool ExecutorAgent::TakeVerificationEvent(const runner_protocol::Event& event, absl::Time now) {
  using Type = runner_protocol::Event::Type;
  if (!verifying_ || !verifying_->sent || event.batch != verifying_->batch) return false;
  Verifying& v = *verifying_;
  switch (event.type) {
    case Type::kVerdict: {
      runner_.Heard(now, true);
      if (event.index >= v.sent_items.size()) return true;  // not one it sent: ignored
      const size_t i = v.sent_items[event.index];
      const VerificationGrant::Item& item = v.grant.items[i];
      RecordVerdict verdict{item.record, item.custom_id, false, false, ""};
      const Json& body = event.body;
      if (body.contains("error")) {
        verdict.reason = JsonString(body, "error");  // the runner could not check it
      } else {
        const rescore::Verdict decided = rescore::Verdict::FromJson(JsonField(body, "verdict"));
        if (!decided.skipped.empty()) {
          verdict.reason = decided.skipped;  // an error line: the chunk checks judge those
        } else {
          verdict.checked = true;
          verdict.passed = decided.passed;
          verdict.reason = decided.reason;
        }
      }
      v.verdicts[i] = std::move(verdict);
      return true;
    }
    case Type::kBatchDone:
    case Type::kError:  // a rescore it refused: what has no verdict goes back unchecked
      if (event.type == Type::kError) MINIONS_LOG(Warning) << "the runner refused the spot check: " << event.message;
      v.done = true;
      runner_.Heard(now, RunnerBusy());
      main_alarm_->Ring();  // report on the next pass
      return true;
    default:
      return false;
  }
}

void ExecutorAgent::EndVerification(const std::string& why) {
  Verifying v = std::move(*verifying_);
  verifying_.reset();
  verify_held_ += clock_->Now() - v.since;
  std::vector<RecordVerdict> verdicts;
  int unchecked = 0;
  for (size_t i = 0; i < v.grant.items.size(); ++i) {
    if (v.verdicts[i]) {
      verdicts.push_back(*v.verdicts[i]);
    } else {
      verdicts.push_back({v.grant.items[i].record, v.grant.items[i].custom_id, false, false, why});
    }
    unchecked += verdicts.back().checked ? 0 : 1;
  }
  absl::Status reported = client_->ReportVerifications(id(), v.grant, verdicts);
  if (!reported.ok()) {
    // Its lease ends on its own and another verifier takes the records: nothing is lost.
    MINIONS_LOG(Warning) << "cannot report the spot check of " << Describe(v.grant.job.ref) << ": "
                         << reported.message();
    return;
  }
  ++verifications_reported_;
  next_verify_ask_ = absl::InfinitePast();  // there may be more waiting
  verify_due_ = true;
  MINIONS_LOG(Info) << "spot check of " << Describe(v.grant.job.ref) << " chunk " << v.grant.seq << " reported: "
                    << verdicts.size() - unchecked << " checked, " << unchecked << " not"
                    << (unchecked > 0 ? " (" + why + ")" : "");
}

}  // namespace minions
