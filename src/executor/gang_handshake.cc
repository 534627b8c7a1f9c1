#include "executor/gang_handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace minions {
namespace {

constexpr char kMagic[] = "MGANG/1\n";
constexpr size_t kMagicSize = 8;
constexpr size_t kNonceSize = 32;
constexpr size_t kMacSize = 32;
static_assert(sizeof(kMagic) == kMagicSize + 1);

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) std::abort();
  return out;
}

std::string Mac(absl::string_view secret, absl::string_view role, absl::string_view nonce_m, absl::string_view nonce_l) {
  const std::string message = absl::StrCat(role, nonce_m, nonce_l);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

bool Same(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

using Deadline = std::chrono::steady_clock::time_point;

int MillisLeft(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

absl::Status SendAll(int fd, absl::string_view bytes, Deadline deadline) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, MillisLeft(deadline)) <= 0) return absl::DeadlineExceededError("the gang peer reads nothing");
      continue;
    }
    return absl::UnavailableError(absl::StrCat("gang handshake: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// Exactly `n` bytes, or an error (the peer closed, said too little in time).
absl::StatusOr<std::string> RecvExactly(int fd, size_t n, Deadline deadline) {
  std::string out(n, '\0');
  size_t off = 0;
  while (off < n) {
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, MillisLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return absl::DeadlineExceededError("the gang peer did not complete the handshake in time");
    ssize_t got = recv(fd, out.data() + off, n - off, MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got <= 0) return absl::UnavailableError("the gang peer closed the connection during the handshake");
    off += static_cast<size_t>(got);
  }
  return out;
}

Deadline DeadlineAfter(absl::Duration timeout) {
  return std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
}

}  // namespace

absl::Status AdmitLeader(int fd, absl::string_view secret, absl::Duration timeout) {
  if (secret.empty()) return absl::PermissionDeniedError("this gate has no secret: it admits nobody");
  const Deadline deadline = DeadlineAfter(timeout);
  const std::string nonce_m = RandomBytes(kNonceSize);
  if (absl::Status s = SendAll(fd, absl::StrCat(absl::string_view(kMagic, kMagicSize), nonce_m), deadline); !s.ok()) {
    return s;
  }
  // The framing first: a raw RPC client (its first command is shorter than the answer) is
  // refused at once, not when the timeout ends.
  absl::StatusOr<std::string> magic = RecvExactly(fd, kMagicSize, deadline);
  if (!magic.ok()) return magic.status();
  if (magic->compare(0, kMagicSize, kMagic, kMagicSize) != 0) {
    return absl::PermissionDeniedError("the peer does not speak the gang handshake (no secret)");
  }
  absl::StatusOr<std::string> answer = RecvExactly(fd, kNonceSize + kMacSize, deadline);
  if (!answer.ok()) return answer.status();
  const std::string nonce_l = answer->substr(0, kNonceSize);
  if (!Same(answer->substr(kNonceSize), Mac(secret, "leader", nonce_m, nonce_l))) {
    return absl::PermissionDeniedError("the peer does not hold this gang attempt's secret");
  }
  return SendAll(fd, Mac(secret, "member", nonce_m, nonce_l), deadline);
}

absl::Status ProveLeader(int fd, absl::string_view secret, absl::Duration timeout) {
  if (secret.empty()) return absl::PermissionDeniedError("no gang secret to prove");
  const Deadline deadline = DeadlineAfter(timeout);
  absl::StatusOr<std::string> challenge = RecvExactly(fd, kMagicSize + kNonceSize, deadline);
  if (!challenge.ok()) return challenge.status();
  if (challenge->compare(0, kMagicSize, kMagic, kMagicSize) != 0) {
    return absl::PermissionDeniedError("the gang member does not speak the gang handshake");
  }
  const std::string nonce_m = challenge->substr(kMagicSize);
  const std::string nonce_l = RandomBytes(kNonceSize);
  if (absl::Status s = SendAll(
          fd, absl::StrCat(absl::string_view(kMagic, kMagicSize), nonce_l, Mac(secret, "leader", nonce_m, nonce_l)),
          deadline);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> proof = RecvExactly(fd, kMacSize, deadline);
  if (!proof.ok()) return absl::PermissionDeniedError("the gang member refused this attempt's secret");
  if (!Same(*proof, Mac(secret, "member", nonce_m, nonce_l))) {
    return absl::PermissionDeniedError("the gang member does not hold this gang attempt's secret (an impostor)");
  }
  return absl::OkStatus();
}

}  // namespace minions
