#include "server/chunk_check.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/json_util.h"
#include "common/logging.h"
#include "model/state_machines.h"
#include "runner/batch_record.h"
#include "runner/record_lines.h"
#include "server/keys.h"

namespace minions {
namespace {

// What an executor's line says about itself, read without building it: whether it is a JSON
// object, the custom_id it answers, and whether it is an error line (error not null, no response
// object, or a response whose status_code is not 200: the executor's own rule, IsErrorOutputLine,
// for which file a line goes to).
struct LineFacts {
  bool object = false;
  bool custom_id_string = false;  // a string custom_id (else null or absent)
  std::string custom_id;
  bool error_null = true;          // absent or null
  bool response_object = false;
  bool status_ok = true;           // response.status_code absent or 200 (400: a refused request)
  // response.body.usage's counts, as the line states them (0 when absent, negative or not an
  // integer; a count is capped at kMaxTokensPerLine, so that no line can make a job's sum
  // overflow or mean anything: the most a record's answer could hold is far below it).
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;  // usage.completion_tokens_details.reasoning_tokens
  bool is_error_line() const { return !error_null || !response_object || !status_ok; }
};

constexpr int64_t kMaxTokensPerLine = int64_t{1} << 32;

class LineFactsReader {
 public:
  explicit LineFactsReader(LineFacts* facts) : facts_(facts) {}

  bool null() { return Value(Kind::kNull, nullptr); }
  bool boolean(bool) { return Value(Kind::kOther, nullptr); }
  bool number_integer(Json::number_integer_t n) {
    if (n >= 0) Count(static_cast<uint64_t>(n));
    Status(n == 200);
    return Value(Kind::kOther, nullptr);
  }
  bool number_unsigned(Json::number_unsigned_t n) {
    Count(n);
    Status(n == 200);
    return Value(Kind::kOther, nullptr);
  }
  bool number_float(Json::number_float_t, const Json::string_t&) { return Value(Kind::kOther, nullptr); }
  bool string(Json::string_t& value) { return Value(Kind::kString, &value); }
  bool binary(Json::binary_t&) { return Value(Kind::kOther, nullptr); }
  bool start_object(std::size_t) {
    if (depth_ == 0) facts_->object = true;
    if (!Value(Kind::kObject, nullptr)) return false;
    return Enter();
  }
  bool end_object() {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (!Value(Kind::kOther, nullptr)) return false;
    return Enter();
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool key(Json::string_t& name) {
    if (depth_ == 1) key_ = name;
    if (depth_ == 1 && name == "response") facts_->status_ok = true;  // a duplicate replaces the first
    if (depth_ >= 1 && depth_ <= kDetailDepth) {
      path_[depth_ - 1] = name;
      // A key on the way to the counts, met again (a duplicate): what its value holds replaces
      // what the earlier one held, as a parser that keeps the last duplicate reads the line.
      if (OnUsagePath(depth_ - 1)) {
        const bool above_counts = depth_ < kUsageDepth;
        if (above_counts || (depth_ == kUsageDepth && name == "prompt_tokens")) facts_->prompt_tokens = 0;
        if (above_counts || (depth_ == kUsageDepth && name == "completion_tokens")) facts_->completion_tokens = 0;
        if (above_counts || (depth_ == kUsageDepth && name == "completion_tokens_details") ||
            (depth_ == kDetailDepth && path_[3] == "completion_tokens_details" && name == "reasoning_tokens")) {
          facts_->reasoning_tokens = 0;
        }
      }
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

 private:
  enum class Kind { kNull, kString, kObject, kOther };
  // The depth of response.body.usage's counts, and of usage.completion_tokens_details's.
  static constexpr int kUsageDepth = 4;
  static constexpr int kDetailDepth = 5;

  // A container opens: its members have no key yet (an array's never get one).
  bool Enter() {
    ++depth_;
    if (depth_ >= 1 && depth_ <= kDetailDepth) path_[depth_ - 1].clear();
    return depth_ <= kMaxJsonDepth;
  }
  // Whether the keys of depths 1..levels+1 are response, body, usage (as far as they go).
  bool OnUsagePath(int levels) const {
    static constexpr const char* kPath[] = {"response", "body", "usage"};
    for (int i = 0; i <= levels && i < kUsageDepth - 1; ++i) {
      if (path_[i] != kPath[i]) return false;
    }
    return true;
  }
  // An integer: one of the line's token counts if it sits at response.body.usage.*_tokens or
  // response.body.usage.completion_tokens_details.reasoning_tokens.
  void Count(uint64_t n) {
    if (depth_ < kUsageDepth || !OnUsagePath(kUsageDepth - 1)) return;
    const int64_t count = static_cast<int64_t>(std::min<uint64_t>(n, kMaxTokensPerLine));
    // A later duplicate wins, as when parsed.
    if (depth_ == kUsageDepth && path_[3] == "prompt_tokens") facts_->prompt_tokens = count;
    if (depth_ == kUsageDepth && path_[3] == "completion_tokens") facts_->completion_tokens = count;
    if (depth_ == kDetailDepth && path_[3] == "completion_tokens_details" && path_[4] == "reasoning_tokens") {
      facts_->reasoning_tokens = count;
    }
  }
  // An integer at response.status_code: whether the response is a 200 (the executor's rule).
  void Status(bool ok) {
    if (depth_ == 2 && path_[0] == "response" && path_[1] == "status_code") facts_->status_ok = ok;
  }
  // A value starts; at depth 1 it is a field of the line (later duplicates win, as when parsed).
  bool Value(Kind kind, const std::string* text) {
    if (depth_ != 1) return true;
    if (key_ == "custom_id") {
      facts_->custom_id_string = kind == Kind::kString;
      facts_->custom_id = text ? *text : "";
    } else if (key_ == "error") {
      facts_->error_null = kind == Kind::kNull;
    } else if (key_ == "response") {
      facts_->response_object = kind == Kind::kObject;
    }
    key_.clear();
    return true;
  }

  LineFacts* facts_;
  int depth_ = 0;
  std::string key_;
  std::string path_[kDetailDepth];  // the key of the value open at each depth 1..5, "" for none
};

absl::StatusOr<LineFacts> ReadLineFacts(std::string_view line) {
  LineFacts facts;
  LineFactsReader reader(&facts);
  bool ok = false;
  try {
    ok = Json::sax_parse(line.begin(), line.end(), &reader, Json::input_format_t::json, /*strict=*/true);
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok || !facts.object) return absl::InvalidArgumentError("is not a JSON object");
  return facts;
}

bool Answers(const LineFacts& facts, const std::string& expected) {
  if (expected.empty()) return !facts.custom_id_string || facts.custom_id.empty();
  return facts.custom_id_string && facts.custom_id == expected;
}

std::string Describe(const Chunk& chunk) {
  return absl::StrCat("chunk ", chunk.seq, " of attempt ", chunk.attempt, " (records ", chunk.begin, "-",
                      chunk.end - 1, ")");
}

std::string Quoted(const LineFacts& facts) {
  return facts.custom_id_string ? absl::StrCat("'", Excerpt(facts.custom_id, 64), "'") : "no custom_id";
}

}  // namespace

absl::StatusOr<std::string> ReadChunkObject(BlobStore& blobs, const std::string& key, int64_t limit) {
  std::string data;
  bool too_large = false;
  absl::Status read = blobs.Read(key, [&](std::string_view piece) {
    if (static_cast<int64_t>(data.size() + piece.size()) > limit) {
      too_large = true;
      return false;
    }
    data.append(piece);
    return true;
  });
  if (too_large) {
    return absl::InvalidArgumentError(absl::StrCat("its object ", key, " is larger than ", limit,
                                                   " bytes, the most a chunk may upload"));
  }
  if (!read.ok()) return read;
  return data;
}

namespace {

std::string ChunkKey(const Task& task, const Chunk& chunk) {
  return absl::StrCat(task.job_id, "/", task.index, "#", chunk.attempt, ".", chunk.seq);
}

}  // namespace

std::vector<std::string> ExpectedCustomIds(const std::vector<std::string>& records, int64_t begin, int64_t end) {
  std::vector<std::string> ids;
  for (int64_t i = std::max<int64_t>(begin, 0); i < end && i < static_cast<int64_t>(records.size()); ++i) {
    ids.push_back(ParseRecordLine(records[static_cast<size_t>(i)]).custom_id);
  }
  return ids;
}

absl::Status VerifyChunk(const Chunk& chunk, std::string_view output, std::string_view errors,
                         const std::vector<std::string>& expected_ids, TokenUsage* tokens) {
  const int64_t n = chunk.end - chunk.begin;
  if (n <= 0 || static_cast<int64_t>(expected_ids.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(chunk), " claims a range the task does not have"));
  }
  std::vector<std::string_view> out_lines = NonBlankLines(output), err_lines = NonBlankLines(errors);
  if (static_cast<int64_t>(out_lines.size() + err_lines.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(chunk), " holds ", out_lines.size(), " output and ",
                                                   err_lines.size(), " error lines for its ", n, " records"));
  }
  if (static_cast<int64_t>(err_lines.size()) != chunk.records_failed) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(chunk), " claims ", chunk.records_failed,
                                                   " failed records but holds ", err_lines.size(), " error lines"));
  }
  std::vector<LineFacts> outs, errs;
  for (size_t i = 0; i < out_lines.size(); ++i) {
    auto facts = ReadLineFacts(out_lines[i]);
    if (!facts.ok()) return absl::InvalidArgumentError(absl::StrCat(Describe(chunk), ": output line ", i + 1, " ", facts.status().message()));
    if (facts->is_error_line()) {
      return absl::InvalidArgumentError(absl::StrCat(Describe(chunk), ": output line ", i + 1, " is an error line"));
    }
    outs.push_back(*std::move(facts));
  }
  for (size_t i = 0; i < err_lines.size(); ++i) {
    auto facts = ReadLineFacts(err_lines[i]);
    if (!facts.ok()) return absl::InvalidArgumentError(absl::StrCat(Describe(chunk), ": error line ", i + 1, " ", facts.status().message()));
    if (!facts->is_error_line()) {
      return absl::InvalidArgumentError(absl::StrCat(Describe(chunk), ": error line ", i + 1, " is not an error"));
    }
    errs.push_back(*std::move(facts));
  }
  // Each record, in order, is answered by the next output line or the next error line.
  size_t o = 0, e = 0;
  for (int64_t i = 0; i < n; ++i) {
    const std::string& id = expected_ids[static_cast<size_t>(i)];
    if (o < outs.size() && Answers(outs[o], id)) {
      ++o;
    } else if (e < errs.size() && Answers(errs[e], id)) {
      ++e;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          Describe(chunk), ": record ", chunk.begin + i, " (custom_id '", Excerpt(id, 64), "') is not answered: ",
          o < outs.size() ? absl::StrCat("output line ", o + 1, " answers ", Quoted(outs[o])) : "no output line left",
          ", ", e < errs.size() ? absl::StrCat("error line ", e + 1, " answers ", Quoted(errs[e])) : "no error line left"));
    }
  }
  if (tokens != nullptr) {
    // Reasoning is a part of the completion: a line that states more counts its completion.
    for (const LineFacts& line : outs) {
      tokens->Add({line.prompt_tokens, line.completion_tokens, std::min(line.reasoning_tokens, line.completion_tokens)});
    }
  }
  return absl::OkStatus();
}

// --- ChunkChecker ---

bool ChunkChecker::Known(const std::string& key) {
  absl::MutexLock lock(&mu_);
  return admitted_.contains(key);
}

bool ChunkChecker::Remember(const std::string& key) {
  constexpr size_t kRemembered = 200000;
  absl::MutexLock lock(&mu_);
  if (!admitted_.insert(key).second) return false;
  admitted_order_.push_back(key);
  if (admitted_order_.size() > kRemembered) {
    admitted_.erase(admitted_order_.front());
    admitted_order_.pop_front();
  }
  return true;
}

absl::Status ChunkChecker::CheckOne(const Task& task, const std::string& input_key, const Chunk& chunk,
                                    std::vector<std::string>* records, TokenUsage* tokens) {
  if (records->empty()) {
    auto input = blobs_->GetRange(input_key, task.byte_begin, task.byte_end - task.byte_begin);
    if (!input.ok()) return absl::UnavailableError(absl::StrCat("cannot read the task's input: ", input.status().message()));
    *records = SplitRecordLines(*input);
    if (static_cast<int64_t>(records->size()) != task.n_records) {
      return absl::DataLossError(absl::StrCat("the task's input holds ", records->size(), " records, not ", task.n_records));
    }
  }
  auto output = ReadChunkObject(*blobs_, keys::ChunkOutput(task.job_id, task.index, chunk.attempt, chunk.seq),
                           options_.max_chunk_bytes);
  if (absl::IsNotFound(output.status())) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(chunk), " was reported but its output was never uploaded"));
  }
  if (!output.ok()) return output.status();
  auto errors = ReadChunkObject(*blobs_, keys::ChunkErrors(task.job_id, task.index, chunk.attempt, chunk.seq),
                           options_.max_chunk_bytes);
  if (absl::IsNotFound(errors.status())) errors = std::string();
  if (!errors.ok()) return errors.status();
  return VerifyChunk(chunk, *output, *errors, ExpectedCustomIds(*records, chunk.begin, chunk.end), tokens);
}

ChunkChecker::Verdict ChunkChecker::Screen(const std::string& executor_id, const LeaseProgress& report,
                                           bool completing, absl::Time now, absl::Status* why,
                                           std::vector<Chunk>* good, const absl::StatusOr<Task>* read) {
  if (report.chunks.empty() && !completing) return Verdict::kAdmit;
  if (!completing) {
    // Chunks admitted before (an executor repeats its list in every heartbeat) are not read again.
    bool all_known = true;
    for (const Chunk& c : report.chunks) {
      all_known &= Known(absl::StrCat(report.job_id, "/", report.task_index, "#", report.attempt, ".", c.seq));
    }
    if (all_known) {
      if (good) *good = report.chunks;
      return Verdict::kAdmit;
    }
  }
  absl::StatusOr<Task> fetched;
  if (read == nullptr) {
    fetched = store_->GetTask(report.job_id, report.task_index);
    read = &fetched;
  }
  const absl::StatusOr<Task>& task = *read;
  if (!task.ok()) return Verdict::kAdmit;  // unknown task: the store refuses the report itself
  // A stale attempt's report is refused by the store; its uploads are never read.
  if (!CheckFence(*task, executor_id, report.attempt).ok()) return Verdict::kAdmit;
  // Which chunks this report would commit: the model's own transition, applied to a copy.
  Task after = *task;
  LeaseProgress as_reported = report;
  for (Chunk& c : as_reported.chunks) c.attempt = report.attempt;  // as the service reads them
  if (completing) {
    if (!CompleteTask(after, as_reported, now).ok()) return Verdict::kAdmit;  // refused by the store anyway
  } else if (!FromShadow(after, report.attempt) && !after.shadow) {
    (void)CommitChunks(after, as_reported.chunks);  // what does not fit is left out by the store too
  }
  std::vector<Chunk> fresh;
  for (const Chunk& c : after.chunks) {
    bool committed = false;
    for (const Chunk& old : task->chunks) committed |= old.attempt == c.attempt && old.seq == c.seq;
    if (!committed) fresh.push_back(c);
  }
  absl::StatusOr<std::shared_ptr<const JobSpec>> spec = specs_.Get(report.job_id);
  if (!spec.ok()) {
    *why = spec.status();
    return Verdict::kUnreadable;
  }
  const std::string& input_key = (*spec)->input_key;
  std::vector<std::string> records;
  std::vector<Chunk> passed;
  for (const Chunk& chunk : fresh) {
    const std::string key = ChunkKey(*task, chunk);
    const bool known = Known(key);
    TokenUsage tokens;
    absl::Status checked = known ? absl::OkStatus() : CheckOne(*task, input_key, chunk, &records, &tokens);
    if (checked.ok()) {
      // Counted by the one screen that admits the chunk first: an executor lists its last chunk
      // in a heartbeat and completes at once, and the two screens may read it side by side.
      if (Remember(key) && !known && metrics_ != nullptr) metrics_->TokensAdmitted((*spec)->team, tokens);
      passed.push_back(chunk);
      continue;
    }
    if (!absl::IsInvalidArgument(checked)) {  // the object store's trouble, not the chunk's
      *why = checked;
      return Verdict::kUnreadable;
    }
    // A forged or broken chunk: the attempt fails, keeping the chunks before it.
    std::vector<Chunk> keep;
    for (const Chunk& c : as_reported.chunks) {
      bool ok = false;
      for (const Chunk& p : passed) ok |= p.seq == c.seq && p.attempt == c.attempt;
      if (!ok) break;
      keep.push_back(c);
    }
    if (good) *good = keep;
    *why = absl::InvalidArgumentError(absl::StrCat("refused ", checked.message()));
    {
      absl::MutexLock lock(&mu_);
      ++rejected_;
    }
    MINIONS_LOG(Warning) << "job=" << report.job_id << " task=" << report.task_index << " attempt=" << report.attempt
                         << " executor=" << executor_id << " uploaded a chunk that fails its check: "
                         << checked.message();
    auto failed = store_->FailTask(executor_id, report.job_id, report.task_index, report.attempt,
                                   FailureClass::kRetryable, std::string(why->message()), now, keep);
    if (!failed.ok() && !absl::IsFailedPrecondition(failed.status())) {
      *why = failed.status();
      return Verdict::kUnreadable;
    }
    return Verdict::kRejected;
  }
  if (good) *good = report.chunks;
  return Verdict::kAdmit;
}

absl::StatusOr<HeartbeatReply> ChunkChecker::Heartbeat(const std::string& executor_id, ExecutorState state,
                                                       const std::string& reason,
                                                       const std::vector<LeaseProgress>& held, absl::Duration ttl,
                                                       absl::Time now, const std::optional<ModelHoldings>& holdings) {
  absl::StatusOr<HeartbeatReply> reply;
  absl::Notification answered;
  HeartbeatAsync(executor_id, state, reason, held, ttl, now, holdings,
                 [&reply, &answered](absl::StatusOr<HeartbeatReply> r) {
                   reply = std::move(r);
                   answered.Notify();
                 });
  answered.WaitForNotification();
  return reply;
}

void ChunkChecker::HeartbeatAsync(const std::string& executor_id, ExecutorState state, const std::string& reason,
                                  const std::vector<LeaseProgress>& held, absl::Duration ttl, absl::Time now,
                                  const std::optional<ModelHoldings>& holdings, HeartbeatBatcher::Answer answer) {
  std::vector<LeaseProgress> admitted, refused;
  for (const LeaseProgress& lease : held) {
    absl::Status why;
    switch (Screen(executor_id, lease, /*completing=*/false, now, &why, nullptr)) {
      case Verdict::kAdmit:
        admitted.push_back(lease);
        break;
      case Verdict::kRejected:
        refused.push_back(lease);
        break;
      case Verdict::kUnreadable: {
        // Renewed, but nothing committed until its chunks can be read.
        LeaseProgress renew_only = lease;
        renew_only.chunks.clear();
        admitted.push_back(std::move(renew_only));
        MINIONS_LOG(Info) << "job=" << lease.job_id << " task=" << lease.task_index
                          << " chunks not committed yet: " << why.message();
        break;
      }
    }
  }
  // The refused attempts are cancelled in the reply, with whatever the store answers.
  auto answer_with_refused = [refused = std::move(refused), answer = std::move(answer)](
                                 absl::StatusOr<HeartbeatReply> reply) mutable {
    if (reply.ok()) {
      for (LeaseProgress& lease : refused) reply->cancel.push_back(std::move(lease));
    }
    std::move(answer)(std::move(reply));
  };
  if (heartbeats_ != nullptr) {
    heartbeats_->Submit(HeartbeatCall{executor_id, state, reason, admitted, holdings}, ttl,
                        std::move(answer_with_refused));
  } else {
    answer_with_refused(store_->Heartbeat(executor_id, state, reason, admitted, ttl, now, holdings));
  }
}

absl::StatusOr<std::vector<absl::Status>> ChunkChecker::CompleteTasks(const std::string& executor_id,
                                                                      const std::vector<LeaseProgress>& reports,
                                                                      absl::Time now) {
  ASSIGN_OR_RETURN(CompletionReply reply, CompleteMany({CompletionCall{executor_id, reports}}, now));
  if (reply.outcomes.size() != 1) return absl::InternalError("the store answered no completion");
  return std::move(reply.outcomes.front());
}

absl::StatusOr<CompletionReply> ChunkChecker::CompleteMany(const std::vector<CompletionCall>& calls, absl::Time now) {
  // The batch's tasks, read once: what every report is screened against.
  std::vector<std::pair<std::string, int64_t>> keys;
  for (const CompletionCall& call : calls) {
    for (const LeaseProgress& report : call.reports) keys.emplace_back(report.job_id, report.task_index);
  }
  std::map<std::pair<std::string, int64_t>, Task> tasks;
  if (!keys.empty()) {
    ASSIGN_OR_RETURN(std::vector<Task> read, store_->GetTasks(keys));
    for (Task& task : read) tasks.emplace(std::make_pair(task.job_id, task.index), std::move(task));
  }
  // Each call screened on its own (its uploads read and checked), several at once: with an object
  // store across the network, a batch's reads would otherwise queue behind each other.
  struct Screened {
    absl::Status unreadable;
    std::vector<absl::Status> refusals;
    CompletionCall pass;
    std::vector<size_t> pass_index;  // the call's report of each of pass.reports
  };
  std::vector<Screened> screened(calls.size());
  auto screen_call = [&](size_t c) {
    const CompletionCall& call = calls[c];
    Screened& out = screened[c];
    out.refusals.resize(call.reports.size());
    out.pass.executor_id = call.executor_id;
    for (size_t i = 0; i < call.reports.size() && out.unreadable.ok(); ++i) {
      const LeaseProgress& report = call.reports[i];
      auto it = tasks.find(std::make_pair(report.job_id, report.task_index));
      const absl::StatusOr<Task> read =
          it == tasks.end() ? absl::StatusOr<Task>(absl::NotFoundError("no such task")) : absl::StatusOr<Task>(it->second);
      absl::Status why;
      switch (Screen(call.executor_id, report, /*completing=*/true, now, &why, nullptr, &read)) {
        case Verdict::kAdmit:
          out.pass.reports.push_back(report);
          out.pass_index.push_back(i);
          break;
        case Verdict::kRejected:
          out.refusals[i] = why;
          break;
        case Verdict::kUnreadable:
          // The executor keeps its completions and tries again shortly.
          out.unreadable = absl::UnavailableError(absl::StrCat("cannot check the uploads yet: ", why.message()));
          break;
      }
    }
  };
  {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t c = next++; c < calls.size(); c = next++) screen_call(c);
    };
    std::vector<std::thread> helpers;
    for (size_t t = 1; t < std::min(calls.size(), kScreeners); ++t) {
      try {
        helpers.emplace_back(work);
      } catch (const std::system_error&) {
        break;  // no thread to be had: this one screens the rest
      }
    }
    work();
    for (std::thread& helper : helpers) helper.join();
  }
  CompletionReply reply;
  reply.outcomes.resize(calls.size());
  std::vector<CompletionCall> admitted;  // what reaches the store
  std::vector<size_t> admitted_call;     // the call of each
  std::vector<std::vector<size_t>> admitted_index;  // the report of each of its reports
  for (size_t c = 0; c < calls.size(); ++c) {
    Screened& call = screened[c];
    if (!call.unreadable.ok()) {
      reply.outcomes[c] = call.unreadable;
      continue;
    }
    reply.outcomes[c] = std::move(call.refusals);
    if (call.pass.reports.empty()) continue;
    admitted.push_back(std::move(call.pass));
    admitted_call.push_back(c);
    admitted_index.push_back(std::move(call.pass_index));
  }
  if (admitted.empty()) return reply;
  ASSIGN_OR_RETURN(CompletionReply stored, store_->CompleteMany(admitted, now));
  if (stored.outcomes.size() != admitted.size()) return absl::InternalError("the store answered no completion");
  for (size_t k = 0; k < admitted.size(); ++k) {
    absl::StatusOr<std::vector<absl::Status>>& answer = reply.outcomes[admitted_call[k]];
    if (!stored.outcomes[k].ok()) {
      answer = stored.outcomes[k].status();  // its executor is unknown: the call as a whole
      continue;
    }
    for (size_t r = 0; r < admitted_index[k].size(); ++r) (*answer)[admitted_index[k][r]] = (*stored.outcomes[k])[r];
  }
  reply.finalizing = std::move(stored.finalizing);
  return reply;
}

absl::StatusOr<Task> ChunkChecker::FailTask(const std::string& executor_id, const std::string& job_id,
                                            int64_t task_index, int attempt, FailureClass failure,
                                            const std::string& message, absl::Time now,
                                            const std::vector<Chunk>& chunks) {
  LeaseProgress report;
  report.job_id = job_id;
  report.task_index = task_index;
  report.attempt = attempt;
  report.chunks = chunks;
  absl::Status why;
  std::vector<Chunk> good;
  switch (Screen(executor_id, report, /*completing=*/false, now, &why, &good)) {
    case Verdict::kAdmit:
      return store_->FailTask(executor_id, job_id, task_index, attempt, failure, message, now, chunks);
    case Verdict::kRejected:
      // Screen failed the attempt already, keeping the chunks that passed.
      return store_->GetTask(job_id, task_index);
    case Verdict::kUnreadable:
      // Fail it as reported, committing nothing unchecked: the next attempt redoes those records.
      return store_->FailTask(executor_id, job_id, task_index, attempt, failure, message, now);
  }
  return absl::InternalError("unreachable");
}

}  // namespace minions
