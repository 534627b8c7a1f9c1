#pragma once
// HttpClient: plain HTTP(S) exchanges through libcurl, set up one way for the whole project (the
// S3 object store and the executor's presigned-URL client both use it), and retried on a Clock.
//
// - Every exchange: no 100-continue round trip, no signals (thread-safe), a connect timeout, and
//   a transfer under 1 byte/s for 60 s is a failure, not a hang. TLS as libcurl verifies it.
// - Send retries a failed transfer and every response its caller calls transient, waiting on the
//   Clock between tries (the backoff doubles from `initial_backoff`), for up to `max_attempts`
//   tries; then Unavailable. A transfer that already fed part of a body to the caller's sink is
//   never retried (the caller would see those bytes twice). Messages name the URL without its
//   query: a presigned URL's signature has no place in a log.
// Owns nothing but its options; borrows the clock. Threads: thread-safe; every exchange has a curl
// handle of its own.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace minions {

class HttpClient {
 public:
  struct Request {
    std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE, ...
    std::string url;
    std::vector<std::string> headers;  // "Name: value"
    std::string_view body;             // sent with PUT and POST
    // When set, the body of a 2xx response goes here, piece by piece, instead of into
    // Response::body; returning false stops the transfer.
    const std::function<bool(std::string_view)>* sink = nullptr;
  };

  struct Response {
    bool reached = false;          // a response came (whatever its status), or the sink stopped it
    std::string transport_error;   // why not, when !reached
    long status = 0;
    std::string body;                            // empty when the sink took it
    std::map<std::string, std::string> headers;  // of the final response; names in lower case
    bool sink_used = false;     // the sink received bytes
    bool sink_stopped = false;  // the sink asked to stop (not a transport failure)
  };

  struct Options {
    int max_attempts = 4;  // tries per Send (the first and the retries)
    absl::Duration initial_backoff = absl::Milliseconds(100);
    absl::Duration connect_timeout = absl::Seconds(10);
  };

  HttpClient(Clock* clock, Options options);

  // One exchange, as it went.
  Response Exchange(const Request& request) const;

  // Exchanges `request()` (made again for each try: a signature may carry the time) until a
  // response comes that `transient` has no reason to retry (it answers nullopt); the reason of
  // the last try otherwise: Unavailable("<reason> (gave up after N attempts)").
  absl::StatusOr<Response> Send(
      absl::FunctionRef<Request()> request,
      absl::FunctionRef<std::optional<std::string>(const Response&)> transient) const;

  const Options& options() const { return options_; }

 private:
  Clock* const clock_;
  const Options options_;
};

// A URL fit for a message: without its query.
std::string RedactedUrl(std::string_view url);

}  // namespace minions
