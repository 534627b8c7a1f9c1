#include "executor/failover_client.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace minions {
namespace {

absl::Status StatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace

FailoverControlPlaneClient::FailoverControlPlaneClient(std::vector<std::string> addresses, Opener open, Clock* clock,
                                                       absl::Duration give_up_after)
    : addresses_(std::move(addresses)), open_(std::move(open)), clock_(clock), give_up_after_(give_up_after) {
  auto first = open_(addresses_.front());
  if (first.ok()) {
    current_.client = std::move(*first);
  } else {
    MINIONS_LOG(Warning) << "server " << addresses_.front() << ": " << first.status().message();
  }
}

std::string FailoverControlPlaneClient::current_address() const {
  absl::MutexLock lock(&mu_);
  return addresses_[current_.index];
}

FailoverControlPlaneClient::Current FailoverControlPlaneClient::Now() {
  absl::MutexLock lock(&mu_);
  return current_;
}

void FailoverControlPlaneClient::Answered(const Current& used) {
  absl::MutexLock lock(&mu_);
  if (used.index == current_.index) unreachable_since_ = absl::InfiniteFuture();
}

bool FailoverControlPlaneClient::Failed(const Current& used, const absl::Status& status) {
  // Only a server nobody answers for is left: any answer, an error included, is a server there.
  if (used.client != nullptr && !absl::IsUnavailable(status)) {
    Answered(used);
    return false;
  }
  absl::MutexLock lock(&mu_);
  if (used.index != current_.index) return true;  // another thread moved on meanwhile: try there
  const absl::Time now = clock_->Now();
  if (unreachable_since_ == absl::InfiniteFuture()) unreachable_since_ = now;
  if (addresses_.size() < 2 || (used.client != nullptr && now - unreachable_since_ < give_up_after_)) return false;
  // The next address that opens and takes the registration; round and round, one lap per call.
  for (size_t step = 1; step <= addresses_.size(); ++step) {
    const size_t index = (used.index + step) % addresses_.size();
    if (index == used.index) break;
    auto opened = open_(addresses_[index]);
    if (!opened.ok()) {
      MINIONS_LOG(Warning) << "server " << addresses_[index] << ": " << opened.status().message();
      continue;
    }
    std::shared_ptr<ControlPlaneClient> client = std::move(*opened);
    if (registration_) {
      auto registered = client->Register(*registration_);
      if (!registered.ok()) {
        MINIONS_LOG(Warning) << "server " << addresses_[index] << " did not take this executor: "
                             << registered.status().message();
        continue;
      }
    }
    MINIONS_LOG(Warning) << "server " << addresses_[used.index] << " has not answered for "
                         << absl::FormatDuration(now - unreachable_since_) << " (" << status.message()
                         << "); going on with " << addresses_[index];
    current_ = {std::move(client), index};
    unreachable_since_ = absl::InfiniteFuture();
    return true;
  }
  return false;
}

template <typename Result>
Result FailoverControlPlaneClient::Run(const std::function<Result(ControlPlaneClient&)>& call) {
  Current used = Now();
  Result result = used.client ? call(*used.client)
                              : Result(absl::UnavailableError(absl::StrCat("cannot open ", addresses_[used.index])));
  if (StatusOf(result).ok()) {
    Answered(used);
    return result;
  }
  if (!Failed(used, StatusOf(result))) return result;
  used = Now();
  result = call(*used.client);
  if (StatusOf(result).ok()) Answered(used);
  return result;
}

absl::StatusOr<v1::RegisterResponse> FailoverControlPlaneClient::Register(const v1::RegisterRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    registration_ = request;
  }
  return Run<absl::StatusOr<v1::RegisterResponse>>([&](ControlPlaneClient& c) { return c.Register(request); });
}

absl::StatusOr<v1::HeartbeatResponse> FailoverControlPlaneClient::Heartbeat(const v1::HeartbeatRequest& request) {
  return Run<absl::StatusOr<v1::HeartbeatResponse>>([&](ControlPlaneClient& c) { return c.Heartbeat(request); });
}

absl::StatusOr<v1::LeaseResponse> FailoverControlPlaneClient::Lease(const v1::LeaseRequest& request) {
  return Run<absl::StatusOr<v1::LeaseResponse>>([&](ControlPlaneClient& c) { return c.Lease(request); });
}

absl::Status FailoverControlPlaneClient::Complete(const v1::CompleteRequest& request) {
  return Run<absl::Status>([&](ControlPlaneClient& c) { return c.Complete(request); });
}

absl::StatusOr<v1::CompleteBatchResponse> FailoverControlPlaneClient::CompleteBatch(
    const v1::CompleteBatchRequest& request) {
  return Run<absl::StatusOr<v1::CompleteBatchResponse>>([&](ControlPlaneClient& c) { return c.CompleteBatch(request); });
}

absl::Status FailoverControlPlaneClient::Fail(const v1::FailRequest& request) {
  return Run<absl::Status>([&](ControlPlaneClient& c) { return c.Fail(request); });
}

absl::StatusOr<v1::LeaseVerificationsResponse> FailoverControlPlaneClient::LeaseVerifications(
    const v1::LeaseVerificationsRequest& request) {
  return Run<absl::StatusOr<v1::LeaseVerificationsResponse>>(
      [&](ControlPlaneClient& c) { return c.LeaseVerifications(request); });
}

absl::Status FailoverControlPlaneClient::ReportVerifications(const v1::ReportVerificationsRequest& request) {
  return Run<absl::Status>([&](ControlPlaneClient& c) { return c.ReportVerifications(request); });
}

void FailoverControlPlaneClient::InterruptLease() {
  Current current = Now();
  if (current.client) current.client->InterruptLease();
}

}  // namespace minions
