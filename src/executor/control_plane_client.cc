#include "executor/control_plane_client.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/private_files.h"
#include "rpc/rpc.h"

namespace minions {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// The client's side of a Beats stream (proto: Beats), on gRPC's synchronous API: one heartbeat at
// a time, its caller waiting for the answer. Once anything goes wrong (the server ended the
// stream, no answer in time) the stream is broken for good: the owner closes it and opens another.
// (Not the callback API: this gRPC's callback completion queue is shared by the process and torn
// down when its last user goes; an executor with nothing else on it would risk that at every
// reconnect. Everything of a synchronous stream is done when Beat or Close returns.)
// Threads: Beat and Close are called by one thread at a time (the owner serialises them); Cancel,
// from any thread, ends a Beat that waits too long.
class BeatStream {
 public:
  BeatStream(v1::Executors::Stub* stub, const std::string& credential) {
    rpc::Prepare(context_, credential, absl::InfiniteDuration());
    // Opening sends nothing and waits for nothing (no connection yet, say): the call's metadata
    // goes with the first beat, whose wait is watched.
    context_.set_initial_metadata_corked(true);
    stream_ = stub->Beats(&context_);
  }
  BeatStream(const BeatStream&) = delete;
  BeatStream& operator=(const BeatStream&) = delete;

  // One heartbeat's answer; or, the stream broken, why (the stream's own status when the server
  // ended it; CANCELLED when Cancel ended it, the caller's timeout).
  absl::StatusOr<v1::HeartbeatResponse> Beat(const v1::HeartbeatRequest& request) {
    v1::HeartbeatResponse reply;
    if (!broken_ && stream_->Write(request) && stream_->Read(&reply)) return reply;
    broken_ = true;
    // Ended by the server (or by Cancel): its status, as it sent it (a cancel first would
    // replace it with CANCELLED, and an older server's UNIMPLEMENTED would go unheard).
    if (!finished_) {
      finished_ = true;
      ended_ = stream_->Finish();
    }
    return Ended();
  }
  // Ends the stream (cancelling it unless it has ended) and returns how it ended.
  absl::Status Close() {
    if (!finished_) {
      finished_ = true;
      context_.TryCancel();
      ended_ = stream_->Finish();
    }
    return Ended();
  }
  void Cancel() { context_.TryCancel(); }

 private:
  absl::Status Ended() const {
    return ended_.ok() ? absl::UnavailableError("the heartbeat stream ended") : rpc::FromGrpc(ended_);
  }

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>> stream_;
  bool broken_ = false;
  bool finished_ = false;
  grpc::Status ended_;
};

class GrpcControlPlaneClient : public ControlPlaneClient {
 public:
  GrpcControlPlaneClient(std::shared_ptr<grpc::Channel> channel, ExecutorCredentials credentials)
      : stub_(v1::Executors::NewStub(channel)), credentials_(std::move(credentials)) {
    if (!credentials_.credential_file.empty()) {
      struct stat st;
      if (stat(credentials_.credential_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
        // Tightened rather than refused: the file is this executor's own, in its state folder.
        MINIONS_LOG(Warning) << credentials_.credential_file << " was readable by others; now mode 0600";
        (void)chmod(credentials_.credential_file.c_str(), 0600);
      }
      credential_ = ReadFirstLine(credentials_.credential_file);
    }
  }

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) override {
    v1::RegisterRequest to_send = request;
    if (Credential().empty()) {
      absl::StatusOr<std::string> enrolled = Enrol(request.capabilities());
      if (!enrolled.ok()) return enrolled.status();
      to_send.set_executor_id(*enrolled);
    }
    absl::StatusOr<v1::RegisterResponse> registered =
        Call(&v1::Executors::Stub::Register, to_send, v1::RegisterResponse());
    if (registered.ok()) {
      absl::MutexLock lock(&mu_);
      rotate_at_ = RotateAt(registered->credential_rotates(), registered->credential_rotate_in_ms());
    }
    if (registered.ok()) StartPresence(registered->executor_id());
    return registered;
  }

  ~GrpcControlPlaneClient() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (presence_context_) presence_context_->TryCancel();
    }
    if (presence_.joinable()) presence_.join();
    {
      absl::MutexLock lock(&beat_mu_);
      if (beats_) (void)beats_->Close();
    }
    {
      absl::MutexLock lock(&watch_mu_);
      watch_stopping_ = true;
    }
    if (beat_watch_.joinable()) beat_watch_.join();
  }
  // On the Beats stream (opened at the first beat, and again at the beat after one breaks); a beat
  // the stream ended without answering is sent again as a Heartbeat call (a heartbeat is
  // idempotent), so a broken stream costs no beat. One the stream did not answer in time is not:
  // a server that slow would keep a call waiting as long. A server without Beats (UNIMPLEMENTED:
  // an older one) gets Heartbeat calls from then on.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) override {
    absl::MutexLock lock(&beat_mu_);
    if (beats_unsupported_) return Call(&v1::Executors::Stub::Heartbeat, request, v1::HeartbeatResponse());
    MaybeRotate();
    if (beats_ && beats_credential_ != Credential()) {
      // Opened with a credential since exchanged, which stops working after its grace.
      (void)beats_->Close();
      beats_.reset();
    }
    if (!beats_) {
      beats_credential_ = Credential();
      beats_ = std::make_unique<BeatStream>(stub_.get(), beats_credential_);
    }
    WatchBeat(kCallDeadline);
    absl::StatusOr<v1::HeartbeatResponse> reply = beats_->Beat(request);
    const bool timed_out = EndWatch();
    if (reply.ok()) return reply;
    (void)beats_->Close();
    beats_.reset();
    if (timed_out) return absl::DeadlineExceededError("the heartbeat stream did not answer in time");
    if (absl::IsUnimplemented(reply.status())) {
      MINIONS_LOG(Info) << "the server has no heartbeat stream (an older server): heartbeats are calls from now on";
      beats_unsupported_ = true;
    } else {
      MINIONS_LOG(Debug) << "heartbeat stream: " << reply.status() << "; this beat goes as a call";
    }
    return Call(&v1::Executors::Stub::Heartbeat, request, v1::HeartbeatResponse());
  }
  absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& request) override {
    auto context = std::make_shared<grpc::ClientContext>();
    {
      absl::MutexLock lock(&mu_);
      lease_context_ = context;
    }
    // The long poll's own wait, and the usual allowance for the answer.
    auto reply = Call(&v1::Executors::Stub::Lease, request, v1::LeaseResponse(), context.get(),
                      absl::Seconds(10) + absl::Milliseconds(request.wait_ms()));
    absl::MutexLock lock(&mu_);
    if (lease_context_ == context) lease_context_.reset();
    return reply;
  }
  void InterruptLease() override {
    absl::MutexLock lock(&mu_);
    if (lease_context_) lease_context_->TryCancel();
  }
  absl::Status CredentialRefused() const override {
    absl::MutexLock lock(&mu_);
    return refused_;
  }
  absl::Status Complete(const v1::CompleteRequest& request) override {
    return Call(&v1::Executors::Stub::Complete, request, v1::CompleteResponse()).status();
  }
  absl::StatusOr<v1::CompleteBatchResponse> CompleteBatch(const v1::CompleteBatchRequest& request) override {
    return Call(&v1::Executors::Stub::CompleteBatch, request, v1::CompleteBatchResponse());
  }
  absl::Status Fail(const v1::FailRequest& request) override {
    return Call(&v1::Executors::Stub::Fail, request, v1::FailResponse()).status();
  }
  absl::StatusOr<v1::LeaseVerificationsResponse> LeaseVerifications(
      const v1::LeaseVerificationsRequest& request) override {
    return Call(&v1::Executors::Stub::LeaseVerifications, request, v1::LeaseVerificationsResponse());
  }
  absl::Status ReportVerifications(const v1::ReportVerificationsRequest& request) override {
    return Call(&v1::Executors::Stub::ReportVerifications, request, v1::ReportVerificationsResponse()).status();
  }

 private:
  // Keeps an Attach stream open to the server for as long as this client lives (proto: the
  // server backs up the tasks of an executor whose stream closes while it runs them). A stream the
  // server ends (it restarted) is opened again after a second.
  void StartPresence(const std::string& executor_id) {
    absl::MutexLock lock(&mu_);
    if (presence_.joinable() || stopping_) return;
    presence_ = std::thread([this, executor_id] {
      while (true) {
        auto context = std::make_shared<grpc::ClientContext>();
        rpc::Prepare(*context, Credential(), absl::InfiniteDuration());
        {
          absl::MutexLock lock(&mu_);
          if (stopping_) return;
          presence_context_ = context;
        }
        v1::AttachRequest request;
        request.set_executor_id(executor_id);
        std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> stream = stub_->Attach(context.get(), request);
        v1::AttachEvent event;
        while (stream->Read(&event)) {
        }
        grpc::Status ended = stream->Finish();
        absl::MutexLock lock(&mu_);
        presence_context_.reset();
        if (stopping_) return;
        MINIONS_LOG(Debug) << "presence stream ended (" << ended.error_message() << "); opening it again";
        // A real wait (the server is down or restarting); the destructor ends it early.
        mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(1));
        if (stopping_) return;
      }
    });
  }

  std::string Credential() {
    absl::MutexLock lock(&mu_);
    return credential_;
  }

  // The server says how long from its answer, on this machine's clock (the two need not agree).
  static absl::Time RotateAt(bool rotates, int64_t in_ms) {
    return rotates ? absl::Now() + absl::Milliseconds(std::max<int64_t>(in_ms, 0)) : absl::InfiniteFuture();
  }

  // Exchanges the credential for a new one once the server's time for it has come (docs/security.md,
  // "Credential lifetimes"), from whichever thread calls first; the others go on with the current
  // one, which works until after the exchange's grace. A failed exchange is tried again a minute
  // later; the old credential stays usable meanwhile.
  void MaybeRotate() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (rotating_ || absl::Now() < rotate_at_) return;
      rotating_ = true;
    }
    absl::Status rotated = Rotate();
    absl::MutexLock lock(&mu_);
    rotating_ = false;
    if (!rotated.ok()) {
      MINIONS_LOG(Warning) << "could not exchange this executor's credential (" << rotated
                           << "); trying again in a minute";
      rotate_at_ = absl::IsUnimplemented(rotated) ? absl::InfiniteFuture() : absl::Now() + absl::Minutes(1);
    }
  }
  absl::Status Rotate() ABSL_LOCKS_EXCLUDED(mu_) {
    grpc::ClientContext context;
    rpc::Prepare(context, Credential(), kCallDeadline);
    v1::RotateCredentialResponse reply;
    grpc::Status status = stub_->RotateCredential(&context, v1::RotateCredentialRequest(), &reply);
    if (!status.ok()) return rpc::FromGrpc(status);
    if (reply.credential().empty()) return absl::InternalError("the server answered no credential");
    // Written before it is used: an executor that stops now restarts with the new one (the old
    // one would expire under it).
    if (!credentials_.credential_file.empty()) {
      if (auto s = WritePrivateFile(credentials_.credential_file, reply.credential() + "\n"); !s.ok()) return s;
    }
    absl::MutexLock lock(&mu_);
    credential_ = reply.credential();
    rotate_at_ = RotateAt(reply.rotates(), reply.rotate_in_ms());
    MINIONS_LOG(Info) << "exchanged this executor's credential for a new one"
                      << (reply.expires_at_ms() > 0
                              ? absl::StrCat(" (expires ", absl::FormatTime(absl::FromUnixMillis(reply.expires_at_ms())), ")")
                              : std::string());
    return absl::OkStatus();
  }

  // Trades the join token for this executor's credential; returns the executor id.
  absl::StatusOr<std::string> Enrol(const v1::Capabilities& capabilities) {
    if (credentials_.join_token.empty()) {
      return absl::UnauthenticatedError(
          "this executor has no credential yet: start it with a join token (--join-token-file FILE, "
          "from `minions admin join-token` on the server)");
    }
    v1::EnrolRequest request;
    *request.mutable_capabilities() = capabilities;
    grpc::ClientContext context;
    rpc::Prepare(context, credentials_.join_token, absl::Seconds(10));
    v1::EnrolResponse reply;
    grpc::Status status = stub_->Enrol(&context, request, &reply);
    if (!status.ok()) return rpc::FromGrpc(status);
    if (!credentials_.credential_file.empty()) {
      // The id first: a credential without its id would be a credential for an unknown executor.
      std::filesystem::path folder = std::filesystem::path(credentials_.credential_file).parent_path();
      if (auto s = WritePrivateFile((folder / "executor-id").string(), reply.executor_id() + "\n"); !s.ok()) return s;
      if (auto s = WritePrivateFile(credentials_.credential_file, reply.credential() + "\n"); !s.ok()) return s;
    }
    MINIONS_LOG(Info) << "enrolled as executor=" << reply.executor_id();
    absl::MutexLock lock(&mu_);
    credential_ = reply.credential();
    return reply.executor_id();
  }

  // One call; on `context` when given (a call another thread may cancel), within `deadline`.
  static constexpr absl::Duration kCallDeadline = absl::Seconds(10);

  template <typename Method, typename Request, typename Reply>
  absl::StatusOr<Reply> Call(Method method, const Request& request, Reply reply, grpc::ClientContext* context = nullptr,
                             absl::Duration deadline = kCallDeadline) {
    grpc::ClientContext own;
    if (context == nullptr) context = &own;
    MaybeRotate();
    rpc::Prepare(*context, Credential(), deadline);
    grpc::Status status = ((*stub_).*method)(context, request, &reply);
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      absl::Status refused = absl::UnauthenticatedError(absl::StrCat(
          "the server refused this executor's credential: ", status.error_message(),
          ". To serve this pool again, remove ",
          credentials_.credential_file.empty() ? std::string("the credential") : credentials_.credential_file,
          " and start with a new join token"));
      absl::MutexLock lock(&mu_);
      if (refused_.ok()) refused_ = refused;
      return refused;
    }
    if (!status.ok()) return rpc::FromGrpc(status);
    return reply;
  }

  std::unique_ptr<v1::Executors::Stub> stub_;
  const ExecutorCredentials credentials_;
  mutable absl::Mutex mu_;
  std::string credential_ ABSL_GUARDED_BY(mu_);
  absl::Status refused_ ABSL_GUARDED_BY(mu_);  // the first UNAUTHENTICATED answer (CredentialRefused)
  // When to exchange the credential (the server says so at registration and at each exchange).
  absl::Time rotate_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool rotating_ ABSL_GUARDED_BY(mu_) = false;  // an exchange is under way
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<grpc::ClientContext> presence_context_ ABSL_GUARDED_BY(mu_);  // the open Attach stream's
  std::shared_ptr<grpc::ClientContext> lease_context_ ABSL_GUARDED_BY(mu_);     // the Lease call waiting now
  std::thread presence_;  // started by the first successful Register; joined by the destructor
  // Watches the beat now on the stream: cancels it when it is not answered within `timeout` (the
  // watch thread, started at the first beat).
  void WatchBeat(absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(beat_mu_) {
    absl::MutexLock lock(&watch_mu_);
    watched_ = beats_.get();
    watch_until_ = absl::Now() + timeout;
    watch_fired_ = false;
    if (!beat_watch_.joinable()) beat_watch_ = std::thread([this] { WatchLoop(); });
  }
  // Ends the watch of the beat; whether it cancelled the beat.
  bool EndWatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(beat_mu_) {
    absl::MutexLock lock(&watch_mu_);
    watched_ = nullptr;
    return watch_fired_;
  }
  void WatchLoop() {
    absl::MutexLock lock(&watch_mu_);
    while (!watch_stopping_) {
      if (watched_ == nullptr) {
        auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_mu_) { return watch_stopping_ || watched_ != nullptr; };
        watch_mu_.Await(absl::Condition(&wake));
        continue;
      }
      BeatStream* const watched = watched_;
      auto ended = [this, watched]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_mu_) {
        return watch_stopping_ || watched_ != watched;
      };
      if (!watch_mu_.AwaitWithDeadline(absl::Condition(&ended), watch_until_)) {
        watched->Cancel();  // the stream is still open: its beat is under way (watched_ is set)
        watch_fired_ = true;
        watched_ = nullptr;
      }
    }
  }

  // Heartbeats go one at a time (the stream carries one at a time).
  absl::Mutex beat_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<BeatStream> beats_ ABSL_GUARDED_BY(beat_mu_);  // open, or none (opened at the next beat)
  std::string beats_credential_ ABSL_GUARDED_BY(beat_mu_);       // the credential beats_ was opened with
  bool beats_unsupported_ ABSL_GUARDED_BY(beat_mu_) = false;      // the server answered Beats UNIMPLEMENTED
  // The watch of the beat under way (WatchBeat): its stream, until when it may take, and whether
  // the watch cancelled it.
  absl::Mutex watch_mu_ ABSL_ACQUIRED_AFTER(beat_mu_);
  BeatStream* watched_ ABSL_GUARDED_BY(watch_mu_) = nullptr;
  absl::Time watch_until_ ABSL_GUARDED_BY(watch_mu_);
  bool watch_fired_ ABSL_GUARDED_BY(watch_mu_) = false;
  bool watch_stopping_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread beat_watch_;  // started at the first beat; joined by the destructor
};

}  // namespace

std::unique_ptr<ControlPlaneClient> MakeGrpcControlPlaneClient(std::shared_ptr<grpc::Channel> channel,
                                                               ExecutorCredentials credentials) {
  return std::make_unique<GrpcControlPlaneClient>(std::move(channel), std::move(credentials));
}

}  // namespace minions
