#include "dashboard/dashboard_sessions.h"

#include <openssl/crypto.h>

#include <utility>

#include "identity/token.h"

namespace minions {

std::string DashboardSessions::Open(const std::string& token, absl::Time now) {
  // The hash of a freshly minted token: 178 bits of the credentials' own random source, in a
  // form no secret scanner mistakes for a credential.
  std::string id = token::Hash(token::Mint(Role::kViewer).text);
  std::string csrf = token::Hash(token::Mint(Role::kViewer).text);
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    it = it->second.ends <= now ? sessions_.erase(it) : std::next(it);
  }
  while (!sessions_.empty() && sessions_.size() >= max_sessions_) {
    auto oldest = sessions_.begin();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->second.ends < oldest->second.ends) oldest = it;
    }
    sessions_.erase(oldest);
  }
  sessions_[id] = Session{token, std::move(csrf), now + lifetime_};
  return id;
}

const DashboardSessions::Session* DashboardSessions::Find(const std::string& id, absl::Time now) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return nullptr;
  if (it->second.ends <= now) {
    sessions_.erase(it);
    return nullptr;
  }
  return &it->second;
}

std::string DashboardSessions::TokenOf(const std::string& id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const Session* session = Find(id, now);
  return session ? session->token : "";
}

std::string DashboardSessions::CsrfOf(const std::string& id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const Session* session = Find(id, now);
  return session ? session->csrf : "";
}

bool DashboardSessions::CsrfMatches(const std::string& id, std::string_view given, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const Session* session = Find(id, now);
  return session != nullptr && !session->csrf.empty() && given.size() == session->csrf.size() &&
         CRYPTO_memcmp(given.data(), session->csrf.data(), given.size()) == 0;
}

void DashboardSessions::Close(const std::string& id) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(id);
}

size_t DashboardSessions::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace minions
