#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "http/http_server.h"
#include "identity/authenticator.h"
#include "model/liveness.h"
#include "model/task_sizing.h"
#include "rpc/tls.h"

namespace minions {


struct ServerOptions {
  std::string listen = "127.0.0.1:7070";  // gRPC address
  // HTTP address for /metrics, /healthz, /readyz and the web dashboard; "" serves no HTTP.
  std::string http_listen;
  // The HTTP port's limits and deadlines (its TLS files are `tls`'s).
  HttpServerOptions http;
  // The certificate both ports present. Required unless both listen on loopback.
  rpc::ServerTls tls;
  // Credentials: every call carries one (identity/authenticator.h); how long a looked-up one is
  // trusted before the store is asked again bounds how soon a revocation made through another
  // server bites.
  AuthenticatorOptions auth;
  absl::Duration lease_ttl = absl::Seconds(9);  // executors holding leases heartbeat every ttl/3
  // How often an executor that holds nothing heartbeats (told at registration). Zero:
  // IdleHeartbeatFor(lease_ttl) (model/liveness.h).
  absl::Duration idle_heartbeat = absl::ZeroDuration();
  absl::Duration IdleHeartbeat() const {
    return idle_heartbeat > absl::ZeroDuration() ? idle_heartbeat : IdleHeartbeatFor(lease_ttl);
  }
  // Tasks of a job submitted without a shard size: records enough to run about `target` on the
  // executors, from the finished tasks of its model and runner (model/task_sizing.h); with no
  // history, `default_records`.
  TaskSizing task_sizing;
  // Limits on what one submission may ask for (docs/operations.md, "Limits"). The largest input
  // sent inline (the gRPC message limit follows it) or named by key; the fewest records per task
  // a job may ask for and the most tasks it may make (each task is a row, a lease and heartbeats).
  int64_t max_input_bytes = kDefaultMaxInputBytes;
  // The largest gRPC message the server receives (every method): inputs larger than
  // kMaxInlineInputBytes and models travel in parts below it. A message past it is refused by gRPC
  // before it is held whole.
  int64_t max_message_bytes = int64_t{5} << 20;
  // gRPC's memory quota for this server (grpc::ResourceQuota::Resize; 0: none). gRPC 1.51 reads a
  // message whole before it applies max_message_bytes, so a caller with a valid credential can
  // make the server hold what it sends; past the quota gRPC cancels streams (RESOURCE_EXHAUSTED,
  // "Buffers full") instead of reading on. Every connection's read buffers and every call's arena
  // count against it, so it must hold the fleet's idle long polls (config server.grpc_memory_mb).
  int64_t grpc_memory_bytes = int64_t{1} << 30;
  int64_t min_shard_size = 1;
  int64_t max_tasks_per_job = 10000;
  // Threads and streams: the most RPCs served at once (each holds a thread of the synchronous
  // server: executors' long polls, watch streams) and, of those, open WatchJob streams. Past either,
  // a call gets RESOURCE_EXHAUSTED instead of a thread.
  int max_threads = 1024;
  // Of those, the most one address (not loopback) and one credential may have in flight at once
  // (server/call_caps.h; docs/security.md 40.2d); 0: no cap.
  int64_t max_calls_per_peer = 256;
  int64_t max_calls_per_credential = 64;
  // Connections that hold the gRPC port without using it: one that has not sent its HTTP/2
  // preface this long after it connected is closed (a client that connects and says nothing: a
  // call without a credential is refused from its headers, so saying nothing is all an
  // unauthenticated peer could hold the port with), and one with no call in flight this long is
  // closed (gRPC's GOAWAY; a client reconnects when it next calls).
  absl::Duration grpc_handshake_timeout = absl::Seconds(10);
  absl::Duration grpc_idle_connection_timeout = absl::Minutes(5);
  // Idle executors' long polls (Lease with wait_ms) are held without a thread each (gRPC's
  // callback API) and served by this many threads, which also run their store lookups. The
  // lookups of the calls being served at once are written together (lease_batch), so these
  // threads also bound how many executors one lease transaction serves.
  int lease_threads = 16;
  // Most Lease calls' lookups written in one store transaction (group commit, as completions;
  // MetadataStore::LeaseMany); 1 looks for each call alone, on its lease thread.
  int lease_batch = 16;
  // An executor that found no work is not looked up in the store again until work is announced
  // (a submission, a requeue, on any server: store/work_signal.h) or this long has passed: the
  // safety net for changes nobody announces. An idle fleet costs one lookup per executor per this.
  absl::Duration idle_recheck = absl::Seconds(30);
  // An idle executor's long poll (LeaseRequest.idle) stands for its idle heartbeat: the server
  // renews its liveness when the call arrives and about every IdleHeartbeat() while it holds it,
  // in the heartbeats' group commit, and tells the executor so at registration. An idle fleet then
  // makes one call per long poll (30 s) instead of one per poll and one per idle beat. False: idle
  // executors heartbeat at the idle pace (as with an older server).
  bool idle_polls_renew = true;
  // The dashboard's history: a point of the fleet every this long, recorded in the store by the
  // server's history thread whether or not anyone watches (dashboard/fleet_view.h).
  absl::Duration history_step = absl::Seconds(15);
  // Executors that enrol are pending (no leases) until an admin approves them (`minions executors
  // approve`): a stolen join token then yields no work (docs/security.md, 40.3).
  bool require_executor_approval = false;
  // Credential lifetimes (identity/identity_admin.h IdentityPolicy; docs/security.md, "Credential
  // lifetimes"): executor credentials (rotated by their executors half-way), submitter and viewer
  // tokens issued without one, and the grace an exchanged executor credential keeps. Zero: never.
  absl::Duration executor_credential_ttl = absl::Hours(24 * 30);
  absl::Duration team_token_ttl = absl::Hours(24 * 90);
  absl::Duration credential_rotation_grace = absl::Minutes(10);
  // The runner names executors may offer (model/placement.h CheckClaimedCapabilities); an
  // executor offering another is refused at enrolment and registration. Empty: any valid name.
  std::vector<std::string> runner_allowlist;
  // A gang reservation that does not fill within this is released (server/gang_leasing.h).
  absl::Duration gang_reservation_timeout = absl::Seconds(30);
  int max_watch_streams = 64;
  // Heartbeats that arrive while others are being written are written together, up to this many
  // in one store transaction (group commit: server/heartbeat_batcher.h); 1 writes each alone.
  int heartbeat_batch = 256;
  // Under steady load (a batch of heartbeats was written less than this ago), a batch waits up to
  // this long for more heartbeats before it is written: fewer, larger transactions (at 2,000
  // heartbeats a second, half the store's transactions and CPU) for a few milliseconds more per
  // heartbeat, counted from the oldest heartbeat waiting. A heartbeat that finds no batch written
  // for longer than this is written at once. Zero: never wait.
  absl::Duration heartbeat_linger = absl::Milliseconds(2);
  // Most executors' completions written in one store transaction (group commit, as heartbeats;
  // MetadataStore::CompleteMany); 1 writes each call alone.
  int completion_batch = 256;
  // The largest object (output or errors) one chunk may upload; a larger one fails its attempt.
  int64_t max_chunk_bytes = int64_t{256} << 20;
  // Spot checks (docs/verification.md): the same switch as StoreOptions::spot_checks, set from the
  // same place (server.spot_checks). On, a producer's commit wakes an idle executor's poll to
  // verify it when the commit drew checks (ExecutorService::WakeAVerifier); off, the server reads
  // nothing about spot checks on a commit.
  bool spot_checks = false;
  // Spot checks (StoreOptions::spot_checks): how long a job whose tasks have all ended waits for
  // its open spot checks before it publishes without them (JobFinalizer). A check goes only to
  // another executor: in a one-executor pool, or while every other executor is busy or away, none
  // may come. The job's status then counts them as open (docs/verification.md).
  absl::Duration verify_wait = absl::Minutes(10);
  // Lease work only to executors whose runners are confined by Landlock and seccomp (macOS:
  // sandbox-exec); others are refused with why (server/confinement_gate.h). Off: every executor
  // is leased work, and `minions executors` shows how each is confined.
  bool require_confined_executors = false;
  // Refuse a job whose model is a path that does not exist on this machine (right for a pool on
  // one machine; a fleet whose executors fetch models elsewhere turns it off).
  bool check_model_paths = true;
  absl::Duration url_ttl = absl::Hours(1);  // of the URLs handed to executors
  // The model registry: the largest model one push may store, and the size of its parts (one
  // gRPC message each; at most max_message_bytes less 64 KiB for the rest of the message).
  int64_t max_model_bytes = int64_t{256} << 30;
  int64_t model_part_bytes = int64_t{4} << 20;
  // Unfinished pushes (parts in the object store, not yet joined): a team may have this many at
  // once (a new one beyond is refused), and one untouched this long is removed, its parts with it.
  int max_unfinished_model_pushes = 4;
  absl::Duration unfinished_model_push_ttl = absl::Hours(24);
  // Once started, the finaliser and the watchdog run on threads of their own. Tests that drive a
  // FakeClock turn them off and call ControlPlane::RunBackgroundPass themselves.
  bool background_thread = true;
};

}  // namespace minions
