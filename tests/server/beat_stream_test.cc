// Heartbeats on a Beats stream (proto: Beats): each beat on the stream is answered exactly as a
// Heartbeat call would answer it, and checked as one (the credential at every beat); the
// executor's gRPC client beats on one stream, sends a beat the stream could not answer as a call,
// and falls back to calls against a server without the stream (an older one). The server runs on
// the fake clock.

#include <functional>

#include "executor/control_plane_client.h"
#include "grpc_service_fixture.h"

namespace minions::testing {
namespace {

class BeatStreamTest : public GrpcServiceTest {
 protected:
  using Stream = grpc::ClientReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>;

  // A Beats stream with `executor_id`'s credential, and its context (which must outlive it).
  std::pair<std::unique_ptr<grpc::ClientContext>, std::unique_ptr<Stream>> Open(const std::string& executor_id) {
    auto context = ExecutorContext(executor_id);
    auto stream = executors_->Beats(context.get());
    return {std::move(context), std::move(stream)};
  }
  static v1::HeartbeatRequest Beat(const std::string& executor_id, const std::string& state,
                                   const std::vector<v1::LeaseRef>& leases = {}) {
    v1::HeartbeatRequest beat;
    beat.set_executor_id(executor_id);
    beat.set_state(state);
    for (const v1::LeaseRef& ref : leases) *beat.add_leases() = ref;
    return beat;
  }
  // One beat on `stream`: its answer, or nullopt when the stream ended instead.
  static std::optional<v1::HeartbeatResponse> Send(Stream& stream, const v1::HeartbeatRequest& beat) {
    if (!stream.Write(beat)) return std::nullopt;
    v1::HeartbeatResponse reply;
    if (!stream.Read(&reply)) return std::nullopt;
    return reply;
  }
  absl::Time LastHeard(const std::string& executor_id) {
    absl::StatusOr<Executor> executor = store_->GetExecutor(executor_id);
    EXPECT_TRUE(executor.ok()) << executor.status();
    return executor.ok() ? executor->last_heartbeat_at : absl::InfinitePast();
  }
};

// Beat after beat on one stream, each answered as a call would be: a held lease renewed from the
// beat's time, a fenced one answered "cancel", the executor's state written.
TEST_F(BeatStreamTest, EachBeatOnTheStreamIsAnsweredAsAHeartbeatCallWouldBe) {
  StartServer();
  v1::Job job = MustSubmit(Records(3), 3);
  const std::string executor = RegisterExecutor("e");
  v1::TaskLease lease = MustLeaseOne(executor);
  auto [context, stream] = Open(executor);

  fake_clock_.Advance(absl::Seconds(5));
  std::optional<v1::HeartbeatResponse> first = Send(*stream, Beat(executor, "busy", {lease.ref()}));
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->renewed_size(), 1);
  EXPECT_EQ(first->renewed(0).task_index(), 0);
  EXPECT_EQ(first->cancel_size(), 0);
  EXPECT_EQ(first->lease_ttl_ms(), absl::ToInt64Milliseconds(kLeaseTtl));
  EXPECT_EQ(StoreTask(job.id(), 0).lease_expires_at, fake_clock_.Now() + kLeaseTtl);

  // A lease it does not hold (another attempt) is answered "stop it", and renewed nowhere.
  fake_clock_.Advance(absl::Seconds(3));
  v1::LeaseRef stale = lease.ref();
  stale.set_attempt(7);
  std::optional<v1::HeartbeatResponse> second = Send(*stream, Beat(executor, "busy", {lease.ref(), stale}));
  ASSERT_TRUE(second.has_value());
  ASSERT_EQ(second->cancel_size(), 1);
  EXPECT_EQ(second->cancel(0).attempt(), 7);
  EXPECT_EQ(StoreTask(job.id(), 0).lease_expires_at, fake_clock_.Now() + kLeaseTtl);

  // Its owner came back: written like any heartbeat's state.
  fake_clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Send(*stream, Beat(executor, "owner_active", {lease.ref()})).has_value());
  EXPECT_EQ(store_->GetExecutor(executor)->state, ExecutorState::kOwnerActive);
  EXPECT_EQ(LastHeard(executor), fake_clock_.Now());
  EXPECT_EQ(server_->executors().beats_streamed(), 3);

  // The executor closes its side: the stream ends well.
  ASSERT_TRUE(stream->WritesDone());
  ASSERT_GRPC_OK(stream->Finish());
}

// The credential is the executor, at every beat: a beat in another executor's name ends the
// stream, and renews nobody (neither the other executor nor the caller).
TEST_F(BeatStreamTest, ABeatInAnotherExecutorsNameEndsTheStreamAndRenewsNobody) {
  StartServer();
  const std::string caller = RegisterExecutor("caller");
  const std::string victim = RegisterExecutor("victim");
  auto [context, stream] = Open(caller);
  ASSERT_TRUE(Send(*stream, Beat(caller, "available")).has_value());
  const absl::Time caller_heard = LastHeard(caller), victim_heard = LastHeard(victim);

  fake_clock_.Advance(absl::Seconds(5));
  EXPECT_FALSE(Send(*stream, Beat(victim, "available")).has_value());
  EXPECT_GRPC_ERROR(stream->Finish(), PERMISSION_DENIED, "not " + victim);
  EXPECT_EQ(LastHeard(victim), victim_heard);
  EXPECT_EQ(LastHeard(caller), caller_heard);
  EXPECT_EQ(server_->executors().beats_streamed(), 1);
}

// A bad beat ends the stream with the call's own refusal; so does a stream with no credential,
// or with a credential that is not an executor's, at its first beat.
TEST_F(BeatStreamTest, RefusalsEndTheStreamWithTheirReason) {
  StartServer();
  const std::string executor = RegisterExecutor("e");
  {
    auto [context, stream] = Open(executor);
    EXPECT_FALSE(Send(*stream, Beat(executor, "lost")).has_value());  // only the server says lost
    EXPECT_GRPC_ERROR(stream->Finish(), INVALID_ARGUMENT, "lost");
  }
  const std::string none;
  const std::vector<std::pair<const std::string*, grpc::StatusCode>> refused = {
      {&none, grpc::StatusCode::UNAUTHENTICATED},
      {&token_, grpc::StatusCode::PERMISSION_DENIED},  // an admin's token is no executor's credential
      {&join_token_, grpc::StatusCode::PERMISSION_DENIED}};
  for (const auto& [token, code] : refused) {
    auto context = Context(token);
    auto stream = executors_->Beats(context.get());
    EXPECT_FALSE(Send(*stream, Beat(executor, "available")).has_value());
    const grpc::Status ended = stream->Finish();
    EXPECT_EQ(ended.error_code(), code) << ended.error_message();
  }
  {
    // Refused when it opens, too: a stream without a credential that never sends a beat holds
    // nothing at the server.
    auto context = Context(&none);
    auto stream = executors_->Beats(context.get());
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(server_->executors().beats_streamed(), 0);
}

// The executor's gRPC client: its heartbeats ride one stream.
TEST_F(BeatStreamTest, TheExecutorsClientBeatsOnTheStream) {
  StartServer();
  std::unique_ptr<ControlPlaneClient> client =
      MakeGrpcControlPlaneClient(rpc::MakeChannel(server_->address()), ExecutorCredentials{"", join_token_});
  v1::RegisterRequest registration;
  registration.mutable_capabilities()->set_name("streamer");
  ASSERT_OK_AND_ASSIGN(v1::RegisterResponse registered, client->Register(registration));
  for (int i = 0; i < 3; ++i) {
    fake_clock_.Advance(absl::Seconds(3));
    ASSERT_OK_AND_ASSIGN(v1::HeartbeatResponse reply, client->Heartbeat(Beat(registered.executor_id(), "available")));
    EXPECT_FALSE(reply.reregister());
    EXPECT_EQ(LastHeard(registered.executor_id()), fake_clock_.Now());
  }
  EXPECT_EQ(server_->executors().beats_streamed(), 3);
}

// A server of the Executors service as an older one, or a broken one, answers: Enrol and Register
// as anyone; Heartbeat calls counted; Beats either not there (UNIMPLEMENTED, as in a server from
// before it), ending each stream after reading one beat, or reading one and never answering. On gRPC's callback API, as the real
// server (a synchronous server made and shut down hundreds of times in a row trips an assertion
// in this gRPC's own shutdown).
class OlderServer final : public v1::Executors::CallbackService {
 public:
  enum class BeatsMode { kNone, kBreak, kSilent };
  explicit OlderServer(BeatsMode beats) : beats_(beats) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~OlderServer() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::ServerUnaryReactor* Enrol(grpc::CallbackServerContext* context, const v1::EnrolRequest*,
                                  v1::EnrolResponse* reply) override {
    reply->set_executor_id("exe-older0000000");
    reply->set_credential("mne_older");
    return Done(context);
  }
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context, const v1::RegisterRequest* request,
                                     v1::RegisterResponse* reply) override {
    reply->set_executor_id(request->executor_id());
    return Done(context);
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context, const v1::HeartbeatRequest*,
                                      v1::HeartbeatResponse* reply) override {
    ++calls;
    reply->set_lease_ttl_ms(9000);
    return Done(context);
  }
  grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>* Beats(
      grpc::CallbackServerContext* context) override {
    ++streams;
    if (beats_ == BeatsMode::kNone) {  // as a server without the method answers (counted here)
      class Unimplemented : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
       public:
        Unimplemented() { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "")); }
        void OnDone() override { delete this; }
      };
      return new Unimplemented;
    }
    // Reads one beat, then ends the stream without answering it, or says nothing until cancelled.
    class Broken : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
     public:
      explicit Broken(bool silent) : silent_(silent) { StartRead(&beat_); }
      void OnReadDone(bool ok) override {
        if (!silent_ || !ok) Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "this stream broke"));
      }
      void OnCancel() override {
        if (silent_) Finish(grpc::Status::CANCELLED);
      }
      void OnDone() override { delete this; }

     private:
      const bool silent_;
      v1::HeartbeatRequest beat_;
    };
    return new Broken(beats_ == BeatsMode::kSilent);
  }

  std::atomic<int> calls{0}, streams{0};

 private:
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  const BeatsMode beats_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

std::unique_ptr<ControlPlaneClient> RegisteredClient(const OlderServer& server) {
  std::unique_ptr<ControlPlaneClient> client =
      MakeGrpcControlPlaneClient(rpc::MakeChannel(server.address()), ExecutorCredentials{"", "join"});
  EXPECT_OK(client->Register(v1::RegisterRequest()));
  return client;
}

// Three beats through a client registered with an older server in `mode`: each is answered (with
// the server's lease TTL) as a call, and after beat i the server has opened `streams_after(i)`
// beat streams.
void ExpectEveryBeatACall(OlderServer::BeatsMode mode, const std::function<int(int)>& streams_after) {
  OlderServer server(mode);
  std::unique_ptr<ControlPlaneClient> client = RegisteredClient(server);
  for (int i = 1; i <= 3; ++i) {
    ASSERT_OK_AND_ASSIGN(v1::HeartbeatResponse reply, client->Heartbeat(v1::HeartbeatRequest()));
    EXPECT_EQ(reply.lease_ttl_ms(), 9000);
    EXPECT_EQ(server.calls.load(), i);
    EXPECT_EQ(server.streams.load(), streams_after(i)) << "after beat " << i;
  }
}

// Against a server without the stream every beat is a call, and the stream is not tried again:
// it was tried once, at the first beat.
TEST(BeatStreamClient, AgainstAServerWithoutTheStreamEveryBeatIsACall) {
  ExpectEveryBeatACall(OlderServer::BeatsMode::kNone, [](int) { return 1; });
}

// A stream that breaks costs no beat: the beat goes as a call, and the next beat opens a new stream.
TEST(BeatStreamClient, ABeatTheStreamCouldNotAnswerGoesAsACallAndTheNextOpensAnotherStream) {
  ExpectEveryBeatACall(OlderServer::BeatsMode::kBreak, [](int beat) { return beat; });
}

// A stream that takes a beat and never answers (a wedged server) ends that beat after the call
// deadline (10 s) with DEADLINE_EXCEEDED, not sent again as a call (a server that slow would keep a
// call as long); the next beat opens another stream.
TEST(BeatStreamClient, ABeatTheStreamNeverAnswersEndsAtTheDeadlineAndIsNotSentAgain) {
  OlderServer silent(OlderServer::BeatsMode::kSilent);
  std::unique_ptr<ControlPlaneClient> client = RegisteredClient(silent);
  absl::StatusOr<v1::HeartbeatResponse> reply = client->Heartbeat(v1::HeartbeatRequest());
  EXPECT_TRUE(absl::IsDeadlineExceeded(reply.status())) << reply.status();
  EXPECT_EQ(silent.calls.load(), 0);
  EXPECT_EQ(silent.streams.load(), 1);
}

}  // namespace
}  // namespace minions::testing
