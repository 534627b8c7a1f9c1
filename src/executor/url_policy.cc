#include "executor/url_policy.h"

#include <curl/curl.h>
#include <limits.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>

#include "absl/strings/ascii.h"
#include "common/host_port.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace minions {
namespace fs = std::filesystem;
namespace {

// The URL without its query or fragment, for messages (presigned queries carry signatures).
std::string Shown(const std::string& url) {
  std::string shown = url.substr(0, url.find_first_of("?#"));
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
  return shown.size() > 200 ? shown.substr(0, 200) + "..." : shown;
}

bool PrintableAscii(const std::string& text) {
  for (unsigned char c : text) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

// The real path of `path` (absolute, lexically normal): its longest existing prefix resolved
// (symbolic links followed), then the components that do not exist yet.
absl::StatusOr<std::string> Resolve(const fs::path& path) {
  fs::path existing = path;
  fs::path rest;
  while (true) {
    std::error_code ec;
    if (fs::symlink_status(existing, ec).type() != fs::file_type::not_found && !ec) break;
    if (!existing.has_relative_path()) break;
    rest = existing.filename() / rest;
    existing = existing.parent_path();
  }
  char resolved[PATH_MAX];
  if (::realpath(existing.c_str(), resolved) == nullptr) {
    return absl::PermissionDeniedError("cannot resolve");
  }
  fs::path real = fs::path(resolved) / rest;
  std::string out = real.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

bool Within(const std::string& path, const std::string& folder) {
  return path == folder || absl::StartsWith(path, folder == "/" ? "/" : folder + "/");
}

}  // namespace

absl::StatusOr<ParsedUrl> ParseObjectUrl(const std::string& url) {
  if (!PrintableAscii(url)) return absl::InvalidArgumentError("the URL has bytes outside printable ASCII");
  std::unique_ptr<CURLU, void (*)(CURLU*)> handle(curl_url(), curl_url_cleanup);
  if (!handle) return absl::InternalError("curl_url failed");
  if (curl_url_set(handle.get(), CURLUPART_URL, url.c_str(), CURLU_DISALLOW_USER) != CURLUE_OK) {
    return absl::InvalidArgumentError("not a URL this executor reads (or it carries user information)");
  }
  auto part = [&](CURLUPart which, unsigned flags, std::string* out) {
    char* value = nullptr;
    CURLUcode code = curl_url_get(handle.get(), which, &value, flags);
    if (code == CURLUE_OK && value != nullptr) *out = value;
    if (value != nullptr) curl_free(value);
    return code == CURLUE_OK;
  };
  ParsedUrl parsed;
  std::string port, fragment;
  if (!part(CURLUPART_SCHEME, 0, &parsed.scheme)) return absl::InvalidArgumentError("the URL has no scheme");
  parsed.scheme = absl::AsciiStrToLower(parsed.scheme);
  if (part(CURLUPART_FRAGMENT, 0, &fragment)) return absl::InvalidArgumentError("the URL has a fragment");
  part(CURLUPART_PATH, 0, &parsed.path);
  if (parsed.scheme == "file") return parsed;
  if (!part(CURLUPART_HOST, 0, &parsed.host) || parsed.host.empty()) {
    return absl::InvalidArgumentError("the URL has no host");
  }
  parsed.host = absl::AsciiStrToLower(parsed.host);
  if (!part(CURLUPART_PORT, CURLU_DEFAULT_PORT, &port)) return absl::InvalidArgumentError("the URL has no port");
  char* end = nullptr;
  parsed.port = std::strtol(port.c_str(), &end, 10);
  if (end == port.c_str() || *end != '\0') return absl::InvalidArgumentError("the URL's port is not a number");
  return parsed;
}

absl::StatusOr<UrlPolicy> UrlPolicy::Create(const UrlPolicyOptions& options) {
  UrlPolicy policy;
  for (const std::string& entry : options.allowed) {
    if (absl::StartsWith(entry, "/") || absl::StartsWithIgnoreCase(entry, "file://")) {
      if (!options.loopback_server) {
        return absl::InvalidArgumentError(absl::StrCat(
            "objects '", entry, "': file:// folders are for a pool on one machine; this executor's server is "
            "elsewhere, so its objects must be on the object store's https origin"));
      }
      std::string path = absl::StartsWithIgnoreCase(entry, "file://") ? entry.substr(7) : entry;
      if (path.empty() || path[0] != '/') {
        return absl::InvalidArgumentError(absl::StrCat("objects '", entry, "': a folder must be an absolute path"));
      }
      auto real = Resolve(fs::path(path).lexically_normal());
      if (!real.ok()) return absl::InvalidArgumentError(absl::StrCat("objects '", entry, "': cannot resolve the folder"));
      policy.folders_.push_back(*real);
      continue;
    }
    auto parsed = ParseObjectUrl(entry);
    if (!parsed.ok() || (parsed->scheme != "https" && parsed->scheme != "http")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "objects '", entry, "' is not an origin like https://s3.example.com:9000 (or a folder for a pool on one "
          "machine)", parsed.ok() ? "" : absl::StrCat(": ", parsed.status().message())));
    }
    if (parsed->path != "" && parsed->path != "/") {
      return absl::InvalidArgumentError(absl::StrCat("objects '", entry, "' must be an origin, without a path"));
    }
    if (parsed->scheme == "http" && !IsLoopbackHost(parsed->host)) {
      return absl::InvalidArgumentError(absl::StrCat("objects '", entry,
                                                     "': plain http is allowed only on loopback; use https"));
    }
    policy.origins_.push_back({parsed->scheme, parsed->host, parsed->port});
  }
  return policy;
}

std::string UrlPolicy::Describe() const {
  std::vector<std::string> parts;
  for (const Origin& o : origins_) parts.push_back(absl::StrCat(o.scheme, "://", o.host, ":", o.port));
  for (const std::string& f : folders_) parts.push_back(absl::StrCat("file://", f));
  return parts.empty() ? "nothing (no objects origin configured)" : absl::StrJoin(parts, ", ");
}

absl::Status UrlPolicy::CheckFile(const std::string& url, bool write) const {
  auto refuse = [&](std::string_view why) {
    return absl::PermissionDeniedError(absl::StrCat("refused ", write ? "to write " : "to read ", Shown(url), ": ",
                                                    std::string(why)));
  };
  if (folders_.empty()) {
    return refuse("file:// URLs are not among this executor's object locations (" + Describe() + ")");
  }
  if (!absl::StartsWithIgnoreCase(url, "file:///")) return refuse("a file URL must be file:///absolute/path");
  std::string path = url.substr(7);
  if (!PrintableAscii(path) || path.find_first_of("?#\\") != std::string::npos) return refuse("unexpected characters");
  fs::path p(path);
  for (const auto& part : p) {
    if (part == "." || part == "..") return refuse("'.' and '..' are not allowed");
  }
  if (p.lexically_normal().string() != path) return refuse("the path is not in normal form");
  auto real = Resolve(p);
  if (!real.ok()) return refuse("cannot resolve the path");
  for (const std::string& folder : folders_) {
    if (Within(*real, folder) && *real != folder) return absl::OkStatus();
  }
  return refuse(absl::StrCat("outside this executor's object folders (", Describe(), ")"));
}

absl::Status UrlPolicy::Check(const std::string& url, bool write) const {
  if (absl::StartsWithIgnoreCase(url, "file:")) return CheckFile(url, write);
  auto parsed = ParseObjectUrl(url);
  if (!parsed.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("refused '", Shown(url), "': ", parsed.status().message()));
  }
  for (const Origin& o : origins_) {
    if (o.scheme == parsed->scheme && o.host == parsed->host && o.port == parsed->port) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat("refused '", Shown(url), "': ", parsed->scheme, "://",
                                                  parsed->host, ":", parsed->port,
                                                  " is not this executor's object store (", Describe(), ")"));
}

absl::StatusOr<std::string> PolicyBlobClient::GetRange(const std::string& url, int64_t begin, int64_t end) {
  if (absl::Status s = policy_.Check(url, false); !s.ok()) return s;
  return inner_->GetRange(url, begin, end);
}

absl::Status PolicyBlobClient::Put(const std::string& url, std::string_view data) {
  if (absl::Status s = policy_.Check(url, true); !s.ok()) return s;
  return inner_->Put(url, data);
}

}  // namespace minions
