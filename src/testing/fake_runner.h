#pragma once
// FakeRunner: an in-process Runner for the executor's tests, on a Clock. It serves what it is
// sent in order, one record every `record_time` of the clock's time, answering each record with
// a response line for its custom_id (an error line for a record that does not parse), and it can
// be told to misbehave: crash when it reaches a record (as a poison record kills a real runner),
// stall (alive, saying nothing more), die at once, refuse a model.
//
// It does no work on its own: each Poll() plays what was due by the clock's now, and
// NextEventAt() says when the next thing is due, so a test's driver knows how far to advance
// time. FakeRunnerFactory starts them and keeps the tally across runners.
// Threads: one thread at a time (a test drives everything from one).

#include <signal.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "runner/batch_record.h"
#include "runner/rescore.h"
#include "runner/runner.h"

namespace minions::testing {

// How fake runners behave, and what they have done: one per test, shared by every runner the
// factory starts (a test changes it as the story goes on).
struct FakeRunnerScript {
  absl::Duration record_time = absl::Milliseconds(10);
  absl::Duration load_time = absl::Milliseconds(50);
  std::string crash_on;    // reaching a record whose line contains this kills the runner
  std::string stall_on;    // ... makes it stop answering, alive
  std::string bad_model;   // loading this model fails with an error
  bool refuse_start = false;  // the program cannot be started
  std::string answer;         // the text of every answer it gives (a forger's, in spot-check tests)
  // `rescore`: an item whose claimed output line contains this fails its check; with
  // cannot_rescore every item is answered with an error (as a runner that cannot check).
  std::string reject_claim = "forged";
  bool cannot_rescore = false;
  // `cancel` is not obeyed (a runner that does not know it): its batches run to their end.
  bool ignores_cancel = false;
  // A model of the fake's own: with `modelled`, the honest answer to a record is a function of its
  // line (ModelledAnswer), and `rescore` checks a claim against it word by word and its usage to
  // the token, as the real check does against the model's logits (reject_claim is then unused).
  bool modelled = false;
  // A dishonest or broken producer (tests/executor/dishonest_executor_test.cc): sees each answer
  // line it gives, with how many it gave before (the plan is driven by progress, never by the
  // clock), and may change it.
  std::function<void(int64_t n, Json& output)> corrupt;

  // The tally.
  int starts = 0;
  int loads = 0;
  int crashes = 0;          // crash_on reached
  int kills = 0;            // Kill() (the executor ended it)
  std::vector<std::string> batches;  // ids, in the order they were sent
  int64_t records_run = 0;  // results given
  std::vector<int> signals;  // Signal() calls, in order
  std::vector<std::string> cancels;  // Cancel() calls' batches, in order
  std::vector<int> tcp_ports;  // the ports the last runner started may connect to (a gang's members)
  std::vector<std::string> rescores;  // `rescore` batch ids, in the order they were sent
  int64_t items_rescored = 0;         // verdicts given
};

// The modelled fake's honest answer to a record line: `kModelledWords` words, each a function of
// the line and its position, and the usage a tokenizer of one token per word (and per 4 bytes of
// prompt) would count.
inline constexpr int kModelledWords = 40;
struct ModelledAnswer {
  std::string text;
  Usage usage;
};
inline ModelledAnswer ModelAnswer(const std::string& record) {
  ModelledAnswer answer;
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : record) h = (h ^ c) * 1099511628211ull;
  for (int i = 0; i < kModelledWords; ++i) {
    h = (h ^ static_cast<uint64_t>(i)) * 1099511628211ull;
    absl::StrAppend(&answer.text, i == 0 ? "" : " ", "w", h % 1000);
  }
  answer.usage.prompt_tokens = static_cast<int>(record.size() / 4 + 1);
  answer.usage.completion_tokens = kModelledWords;
  return answer;
}
// What the modelled fake's check says of a claimed output line for `record` (rescore::Verdict).
inline rescore::Verdict CheckModelled(const std::string& record, const Json& claim) {
  rescore::Verdict verdict;
  if (claim.contains("error") && !claim["error"].is_null()) {
    verdict.skipped = "an error line";
    return verdict;
  }
  const Json body = claim.contains("response") ? claim["response"].value("body", Json::object()) : Json::object();
  const Json choices = body.value("choices", Json::array());
  const std::string text =
      choices.is_array() && !choices.empty() && choices[0].is_object() ? choices[0].value("text", std::string()) : "";
  const Json usage = body.value("usage", Json::object());
  const ModelledAnswer honest = ModelAnswer(record);
  const std::vector<std::string> claimed = absl::StrSplit(text, ' '), expected = absl::StrSplit(honest.text, ' ');
  for (size_t i = 0; i < std::max(claimed.size(), expected.size()); ++i) {
    if (i >= claimed.size() || i >= expected.size() || claimed[i] != expected[i]) {
      verdict.reason = absl::StrCat("greedy: answer token ", i, " is not the most likely");
      return verdict;
    }
  }
  if (usage.value("prompt_tokens", -1) != honest.usage.prompt_tokens ||
      usage.value("completion_tokens", -1) != honest.usage.completion_tokens) {
    verdict.reason = absl::StrCat("usage: claims ", usage.dump(), "; counted ", honest.usage.prompt_tokens, " + ",
                                  honest.usage.completion_tokens);
    return verdict;
  }
  verdict.passed = true;
  return verdict;
}

class FakeRunner : public Runner {
 public:
  // `on_destroyed` (may be null) is told when the executor is done with it.
  FakeRunner(Clock* clock, FakeRunnerScript* script, std::function<void(FakeRunner*)> on_destroyed = nullptr)
      : clock_(clock), script_(script), on_destroyed_(std::move(on_destroyed)), free_at_(clock->Now()) {
    Emit(Json{{"type", "ready"}, {"protocol", runner_protocol::kProtocolVersion}});
  }
  ~FakeRunner() override {
    if (!ended_) ++script_->kills;  // destroyed alive: SIGKILLed
    if (on_destroyed_) on_destroyed_(this);
  }

  void Load(const runner_protocol::LoadRequest& request) override { Queue({Command::kLoad, request.model, {}}); }
  void StartBatch(const std::string& batch, const std::vector<std::string>& records) override {
    script_->batches.push_back(batch);
    Queue({Command::kRun, batch, records});
  }
  void StartRescore(const rescore::Request& request) override {
    script_->rescores.push_back(request.batch);
    Command command{Command::kRescore, request.batch, {}};
    for (const rescore::Item& item : request.items) {
      command.records.push_back(item.record);
      command.claims.push_back(DumpJson(item.output));
    }
    Queue(std::move(command));
  }
  void Cancel(const std::string& batch) override {
    script_->cancels.push_back(batch);
    if (script_->ignores_cancel) return;
    if (current_ && current_->id == batch) current_->cancelled = true;
    for (auto& command : commands_) {
      if (command.id == batch) command.cancelled = true;
    }
  }
  void RequestShutdown() override { Queue({Command::kShutdown, "", {}}); }

  absl::StatusOr<std::optional<runner_protocol::Event>> Poll() override {
    Play(clock_->Now());
    if (!events_.empty()) {
      runner_protocol::Event event = std::move(events_.front());
      events_.pop_front();
      return std::optional<runner_protocol::Event>(std::move(event));
    }
    if (ended_) {
      end_taken_ = true;
      return *ended_;
    }
    return std::optional<runner_protocol::Event>();
  }

  void Kill() override {
    if (ended_) return;
    ++script_->kills;
    End(absl::UnavailableError("fake runner ended: killed by signal 9 (Killed)"));
  }
  void Signal(int signal) override {
    script_->signals.push_back(signal);
    const absl::Time now = clock_->Now();
    if (signal == SIGKILL) return Kill();
    if (signal == SIGSTOP && !stopped_since_) stopped_since_ = now;
    if (signal == SIGCONT && stopped_since_) {
      // Work that was due while it was stopped is late by as long.
      Shift(now - *stopped_since_);
      stopped_since_.reset();
    }
  }
  pid_t pid() const override { return 0; }

  // The test's hands.
  void Die(const std::string& why = "exited with code 1") { End(absl::UnavailableError("fake runner ended: " + why)); }
  bool ended() const { return ended_.has_value(); }
  bool stalled() const { return stalled_; }
  bool stopped() const { return stopped_since_.has_value(); }
  // Holds no work: nothing running, nothing queued.
  bool idle() const { return !current_ && commands_.empty(); }
  // When something is next due: an event to take, or the next step of its work.
  // InfiniteFuture when idle, stalled, stopped or ended (with nothing left to take).
  absl::Time NextEventAt() const {
    if (!events_.empty() || (ended_ && !end_taken_)) return clock_->Now();
    if (ended_ || stalled_ || stopped_since_) return absl::InfiniteFuture();
    return next_step_at_.value_or(absl::InfiniteFuture());
  }

 private:
  struct Command {
    enum Kind { kLoad, kRun, kRescore, kShutdown } kind;
    std::string id;  // kLoad: the model; kRun, kRescore: the batch
    std::vector<std::string> records;
    std::vector<std::string> claims;  // kRescore: the claimed output lines, by item
    bool cancelled = false;
    size_t next = 0;  // kRun: the next record to answer
  };

  void Queue(Command command) {
    if (ended_) return;
    commands_.push_back(std::move(command));
    Schedule(clock_->Now());
  }

  // When the next step of the work is due, from what is queued.
  void Schedule(absl::Time now) {
    if (!current_ && !commands_.empty()) {
      current_ = std::move(commands_.front());
      commands_.pop_front();
      free_at_ = std::max(free_at_, now);
    }
    if (!current_) {
      next_step_at_.reset();
      return;
    }
    if (current_->kind == Command::kLoad) {
      next_step_at_ = free_at_ + script_->load_time;
    } else if ((current_->kind == Command::kRun || current_->kind == Command::kRescore) && !current_->cancelled) {
      next_step_at_ = free_at_ + script_->record_time;
    } else {
      next_step_at_ = free_at_;
    }
  }

  void Shift(absl::Duration by) {
    free_at_ += by;
    if (next_step_at_) *next_step_at_ += by;
  }

  // Plays every step due by `now`.
  void Play(absl::Time now) {
    while (!ended_ && !stalled_ && !stopped_since_ && next_step_at_ && *next_step_at_ <= now) {
      const absl::Time at = *next_step_at_;
      free_at_ = at;
      Step(at);
      Schedule(at);
    }
  }

  void Step(absl::Time at) {
    Command& c = *current_;
    switch (c.kind) {
      case Command::kLoad:
        ++script_->loads;
        if (!script_->bad_model.empty() && c.id == script_->bad_model) {
          Emit(Json{{"type", "error"}, {"op", "load"}, {"message", "model file '" + c.id + "' is not a GGUF file"}});
        } else {
          Emit(Json{{"type", "loaded"}, {"model", c.id}, {"info", Json::object()}});
        }
        current_.reset();
        return;
      case Command::kShutdown:
        current_.reset();
        End(absl::UnavailableError("fake runner ended: exited with code 0"));
        return;
      case Command::kRescore: {
        if (c.cancelled || c.next >= c.records.size()) {
          Emit(Json{{"type", "batch_done"}, {"batch", c.id}, {"records", c.records.size()}, {"cancelled", c.cancelled}});
          current_.reset();
          return;
        }
        const std::string custom_id = ParseRecordLine(c.records[c.next]).custom_id;
        Json verdict{{"type", "verdict"}, {"batch", c.id}, {"index", c.next}, {"custom_id", custom_id}};
        if (script_->cannot_rescore) {
          verdict["error"] = "this runner cannot check answers";
        } else if (script_->modelled) {
          auto claim = ParseJson(c.claims[c.next]);
          verdict["verdict"] = CheckModelled(c.records[c.next], claim.ok() ? *claim : Json::object()).ToJson();
        } else {
          rescore::Verdict decided;
          decided.passed = script_->reject_claim.empty() || c.claims[c.next].find(script_->reject_claim) == std::string::npos;
          if (!decided.passed) decided.reason = "greedy: answer token 0 is 9.00 nats below the most likely token";
          verdict["verdict"] = decided.ToJson();
        }
        Emit(std::move(verdict));
        ++script_->items_rescored;
        ++c.next;
        return;
      }
      case Command::kRun:
        if (c.cancelled || c.next >= c.records.size()) {
          // As the protocol says: every record not answered gets a `cancelled` error line.
          for (size_t i = c.next; c.cancelled && i < c.records.size(); ++i) {
            Emit(Json{{"type", "result"}, {"batch", c.id}, {"index", i},
                      {"output", MakeErrorLine(ParseRecordLine(c.records[i]).custom_id, kErrorCancelled,
                                               "the batch was cancelled")}});
          }
          Emit(Json{{"type", "batch_done"}, {"batch", c.id}, {"records", c.records.size()},
                        {"cancelled", c.cancelled}});
          current_.reset();
          return;
        }
        const std::string& record = c.records[c.next];
        if (!script_->crash_on.empty() && record.find(script_->crash_on) != std::string::npos) {
          ++script_->crashes;
          End(absl::UnavailableError("fake runner ended: killed by signal 6 (Aborted)"));
          return;
        }
        if (!script_->stall_on.empty() && record.find(script_->stall_on) != std::string::npos) {
          stalled_ = true;
          return;
        }
        ParsedRecord parsed = ParseRecordLine(record);
        const ModelledAnswer modelled = script_->modelled ? ModelAnswer(record) : ModelledAnswer{script_->answer, {}};
        Json output = parsed.ok() ? MakeResponseLine(parsed.custom_id, MakeCompletionBody(parsed.custom_id, "fake",
                                                                                          modelled.text, "stop",
                                                                                          modelled.usage, 0))
                                  : MakeErrorLine(parsed.custom_id, parsed.error_code, parsed.error_message);
        if (script_->corrupt) script_->corrupt(script_->records_run, output);
        Emit(Json{{"type", "result"}, {"batch", c.id}, {"index", c.next}, {"output", std::move(output)}});
        ++script_->records_run;
        ++c.next;
        if (c.next >= c.records.size()) {
          Emit(Json{{"type", "batch_done"}, {"batch", c.id}, {"records", c.records.size()}, {"cancelled", false}});
          current_.reset();
        }
        return;
    }
  }

  void Emit(Json body) {
    auto event = runner_protocol::DecodeEvent(DumpJson(body));
    if (event.ok()) events_.push_back(std::move(*event));
  }

  void End(absl::Status why) {
    if (ended_) return;
    ended_ = std::move(why);
    current_.reset();
    commands_.clear();
    next_step_at_.reset();
  }

  Clock* clock_;
  FakeRunnerScript* script_;
  std::function<void(FakeRunner*)> on_destroyed_;
  std::deque<Command> commands_;
  std::optional<Command> current_;
  absl::Time free_at_;                      // the current step began then
  std::optional<absl::Time> next_step_at_;  // the next step of the work is due
  std::deque<runner_protocol::Event> events_;
  std::optional<absl::Status> ended_;
  bool end_taken_ = false;
  bool stalled_ = false;
  std::optional<absl::Time> stopped_since_;
};

class FakeRunnerFactory : public RunnerFactory {
 public:
  FakeRunnerFactory(Clock* clock, FakeRunnerScript* script) : clock_(clock), script_(script) {}
  absl::StatusOr<std::unique_ptr<Runner>> Start(std::function<void()>) override {
    if (script_->refuse_start) return absl::NotFoundError("cannot start 'fake-runner': No such file or directory");
    ++script_->starts;
    auto runner = std::make_unique<FakeRunner>(clock_, script_, [this](FakeRunner* gone) {
      live_.erase(std::remove(live_.begin(), live_.end(), gone), live_.end());
    });
    live_.push_back(runner.get());
    return std::unique_ptr<Runner>(std::move(runner));
  }
  // A gang leader's runner: the same, noting the ports it may reach.
  absl::StatusOr<std::unique_ptr<Runner>> StartConnecting(std::function<void()> on_event,
                                                          const std::vector<int>& tcp_ports) override {
    script_->tcp_ports = tcp_ports;
    return Start(std::move(on_event));
  }
  // The runner the executor holds now; null when it holds none.
  FakeRunner* live() const { return live_.empty() ? nullptr : live_.back(); }
  absl::Time NextEventAt() const {
    absl::Time next = absl::InfiniteFuture();
    for (const FakeRunner* runner : live_) next = std::min(next, runner->NextEventAt());
    return next;
  }

 private:
  Clock* clock_;
  FakeRunnerScript* script_;
  std::vector<FakeRunner*> live_;  // started and not yet destroyed
};

}  // namespace minions::testing
