#include "server/call_caps.h"

#include <grpcpp/server_context.h>

#include <functional>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/host_port.h"

namespace minions {
namespace {

constexpr char kBearer[] = "Bearer ";

// Counts its call from the headers to its end (CallCaps). One per call, made by gRPC; its hook
// points run one after another, never at once, and it is destroyed when the call has ended.
class CallCapInterceptor final : public grpc::experimental::Interceptor {
 public:
  CallCapInterceptor(grpc::experimental::ServerRpcInfo* info, CallCaps* caps) : info_(info), caps_(caps) {}
  ~CallCapInterceptor() override {
    if (counted_) caps_->Ended(peer_, token_);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      std::multimap<grpc::string_ref, grpc::string_ref>* metadata = methods->GetRecvInitialMetadata();
      if (metadata != nullptr) {
        metadata->erase(kOverCapHeader);  // only this interceptor says so, never the caller
        if (auto it = metadata->find("authorization"); it != metadata->end()) {
          std::string value(it->second.data(), it->second.size());
          if (absl::StartsWith(value, kBearer)) token_ = value.substr(sizeof(kBearer) - 1);
        }
        grpc::ServerContextBase* context = info_->server_context();
        peer_ = context != nullptr ? context->peer() : "";
        const std::string_view over = caps_->Admit(peer_, token_);
        if (over.empty()) {
          counted_ = true;
        } else {
          // Kept here, as the metadata refers to it until the call ends.
          refusal_ = over == "peer"
                         ? absl::StrCat("this server serves at most ", caps_->options().per_peer,
                                        " calls at once from one address; retry when some of yours have ended")
                         : absl::StrCat("this server serves at most ", caps_->options().per_credential,
                                        " calls at once with one credential; retry when some of yours have ended");
          metadata->emplace(grpc::string_ref(kOverCapHeader), grpc::string_ref(refusal_));
        }
      }
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;  // gRPC's, outlives this interceptor
  CallCaps* const caps_;
  std::string peer_, token_, refusal_;
  bool counted_ = false;
};

}  // namespace

std::string PeerAddress(std::string_view rendered) {
  const std::string peer(rendered);
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return "";  // unix:, or unknown
  std::string_view address = std::string_view(peer).substr(5);
  if (const size_t colon = address.rfind(':'); colon != std::string_view::npos) address = address.substr(0, colon);
  std::string host(address);
  // gRPC writes IPv6 bracketed, and some releases percent-encode the brackets.
  static constexpr std::pair<const char*, const char*> kEncoded[] = {{"%5B", "["}, {"%5D", "]"}, {"%3A", ":"}};
  for (const auto& [from, to] : kEncoded) {
    for (size_t at = host.find(from); at != std::string::npos; at = host.find(from)) host.replace(at, 3, to);
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (IsLoopbackHost(host)) return "";
  return peer.substr(0, 5) + host;
}

grpc::experimental::Interceptor* CallCaps::CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) {
  return new CallCapInterceptor(info, this);
}

std::string_view CallCaps::Admit(const std::string& peer, const std::string& token) {
  const std::string address = PeerAddress(peer);
  const size_t credential = std::hash<std::string>()(token);
  absl::MutexLock lock(&mu_);
  if (!address.empty() && options_.per_peer > 0) {
    auto it = peers_.find(address);
    if (it != peers_.end() && it->second >= options_.per_peer) return "peer";
  }
  if (!token.empty() && options_.per_credential > 0) {
    auto it = credentials_.find(credential);
    if (it != credentials_.end() && it->second >= options_.per_credential) return "credential";
  }
  if (!address.empty()) ++peers_[address];
  if (!token.empty()) ++credentials_[credential];
  return "";
}

void CallCaps::Ended(const std::string& peer, const std::string& token) {
  const std::string address = PeerAddress(peer);
  const size_t credential = std::hash<std::string>()(token);
  absl::MutexLock lock(&mu_);
  if (!address.empty()) {
    if (auto it = peers_.find(address); it != peers_.end() && --it->second <= 0) peers_.erase(it);
  }
  if (!token.empty()) {
    if (auto it = credentials_.find(credential); it != credentials_.end() && --it->second <= 0) credentials_.erase(it);
  }
}

int64_t CallCaps::FromPeer(const std::string& peer) const {
  const std::string address = PeerAddress(peer);
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(address);
  return it == peers_.end() ? 0 : it->second;
}

int64_t CallCaps::WithCredential(const std::string& token) const {
  const size_t credential = std::hash<std::string>()(token);
  absl::MutexLock lock(&mu_);
  auto it = credentials_.find(credential);
  return it == credentials_.end() ? 0 : it->second;
}

absl::Status OverCapRefusal(const grpc::ServerContextBase* context) {
  auto it = context->client_metadata().find(kOverCapHeader);
  if (it == context->client_metadata().end()) return absl::OkStatus();
  return absl::ResourceExhaustedError(std::string(it->second.data(), it->second.size()));
}

}  // namespace minions
