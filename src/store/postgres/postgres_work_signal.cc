#include "store/postgres/postgres_work_signal.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "store/postgres/pg_connection.h"

namespace minions {
namespace {

std::string RandomId() {
  std::random_device device;
  return absl::StrFormat("%08x%08x", device(), device());
}

std::string ErrorOf(PGconn* conn) {
  std::string message = conn != nullptr ? PQerrorMessage(conn) : "out of memory";
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r')) message.pop_back();
  return message;
}

// The channel of the store in the session's schema (stores in two schemas of one database do not
// wake each other): a name of at most 63 bytes whatever the schema's length.
constexpr char kChannelQuery[] =
    "SELECT 'minions_work_' || to_hex(hashtext(COALESCE(current_schema(), '')))";

}  // namespace

absl::StatusOr<std::unique_ptr<PostgresWorkSignal>> PostgresWorkSignal::Create(const std::string& conninfo) {
  if (absl::Status valid = postgres_store::CheckConninfo(conninfo); !valid.ok()) return valid;
  return std::unique_ptr<PostgresWorkSignal>(new PostgresWorkSignal(conninfo));
}

PostgresWorkSignal::PostgresWorkSignal(std::string conninfo) : conninfo_(std::move(conninfo)), id_(RandomId()) {}

PostgresWorkSignal::~PostgresWorkSignal() {
  Stop();
  absl::MutexLock lock(&announce_mu_);
  if (announcer_ != nullptr) PQfinish(announcer_);
  announcer_ = nullptr;
}

absl::StatusOr<std::string> PostgresWorkSignal::Connect(PGconn*& conn) {
  if (conn != nullptr) PQfinish(conn);
  conn = PQconnectdb(conninfo_.c_str());
  if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
    std::string message = ErrorOf(conn);
    if (conn != nullptr) PQfinish(conn);
    conn = nullptr;
    return absl::UnavailableError(absl::StrCat("cannot connect to PostgreSQL: ", message));
  }
  PQsetNoticeProcessor(conn, [](void*, const char*) {}, nullptr);
  PGresult* result = PQexec(conn, kChannelQuery);
  if (result == nullptr || PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
    std::string message = ErrorOf(conn);
    PQclear(result);
    PQfinish(conn);
    conn = nullptr;
    return absl::UnavailableError(absl::StrCat("cannot name the work channel: ", message));
  }
  std::string channel = PQgetvalue(result, 0, 0);
  PQclear(result);
  return channel;
}

absl::Status PostgresWorkSignal::Announce() {
  absl::MutexLock lock(&announce_mu_);
  // One retry: a connection that broke since the last announcement (a database restart) is made
  // again once.
  for (int tries = 0; tries < 2; ++tries) {
    if (announcer_ == nullptr || PQstatus(announcer_) != CONNECTION_OK) {
      absl::StatusOr<std::string> channel = Connect(announcer_);
      if (!channel.ok()) return channel.status();
      channel_ = *channel;
    }
    const char* values[2] = {channel_.c_str(), id_.c_str()};
    PGresult* result = PQexecParams(announcer_, "SELECT pg_notify($1, $2)", 2, nullptr, values, nullptr, nullptr, 0);
    const bool ok = result != nullptr && PQresultStatus(result) == PGRES_TUPLES_OK;
    PQclear(result);
    if (ok) return absl::OkStatus();
    if (PQstatus(announcer_) == CONNECTION_OK) {
      return absl::UnavailableError(absl::StrCat("cannot announce work: ", ErrorOf(announcer_)));
    }
  }
  return absl::UnavailableError(absl::StrCat("cannot announce work: ", ErrorOf(announcer_)));
}

absl::Status PostgresWorkSignal::Start(std::function<void()> on_work) {
  if (listener_.joinable()) return absl::FailedPreconditionError("the work signal is already started");
  if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) return absl::InternalError("cannot make a pipe");
  on_work_ = std::move(on_work);
  listener_ = std::thread([this] { ListenLoop(); });
  return absl::OkStatus();
}

void PostgresWorkSignal::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_pipe_[1] >= 0) (void)!::write(wake_pipe_[1], "x", 1);
  if (listener_.joinable()) listener_.join();
  for (int& fd : wake_pipe_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void PostgresWorkSignal::ListenLoop() {
  PGconn* conn = nullptr;
  bool reported_down = false;
  bool first = true;  // nothing was missed before the first LISTEN
  while (!stopping_.load()) {
    if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
      absl::StatusOr<std::string> channel = Connect(conn);
      if (channel.ok()) {
        char* quoted = PQescapeIdentifier(conn, channel->c_str(), channel->size());
        PGresult* listen = PQexec(conn, absl::StrCat("LISTEN ", quoted).c_str());
        PQfreemem(quoted);
        const bool ok = listen != nullptr && PQresultStatus(listen) == PGRES_COMMAND_OK;
        PQclear(listen);
        if (!ok) channel = absl::UnavailableError(ErrorOf(conn));
      }
      if (!channel.ok()) {
        if (!reported_down) {
          MINIONS_LOG(Warning) << "work announcements from other servers unheard (retrying each second): "
                               << channel.status().message();
        }
        reported_down = true;
        if (conn != nullptr) PQfinish(conn);
        conn = nullptr;
        pollfd stop{wake_pipe_[0], POLLIN, 0};
        ::poll(&stop, 1, 1000);
        continue;
      }
      if (reported_down) MINIONS_LOG(Info) << "work announcements from other servers heard again";
      reported_down = false;
      if (!first) on_work_();  // whatever was announced while this was not listening
      first = false;
    }
    pollfd fds[2] = {{PQsocket(conn), POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;
    if (fds[1].revents != 0) break;
    if (PQconsumeInput(conn) == 0) {
      PQfinish(conn);
      conn = nullptr;
      continue;
    }
    bool others = false;
    while (PGnotify* notify = PQnotifies(conn)) {
      if (id_ != notify->extra) others = true;
      PQfreemem(notify);
    }
    if (others) {
      seen_.fetch_add(1);
      on_work_();
    }
  }
  if (conn != nullptr) PQfinish(conn);
}

}  // namespace minions
