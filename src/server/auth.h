#pragma once
// Bearer-token check shared by the services. An empty token means no authentication (a pool on
// one machine, bound to loopback).

#include <grpcpp/grpcpp.h>

#include <string>

namespace minions {

inline grpc::Status CheckToken(const grpc::ServerContext* context, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  auto it = context->client_metadata().find("authorization");
  if (it == context->client_metadata().end() ||
      std::string(it->second.data(), it->second.size()) != "Bearer " + token) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing or wrong token: pass --token or set MINIONS_TOKEN");
  }
  return grpc::Status::OK;
}

}  // namespace minions
