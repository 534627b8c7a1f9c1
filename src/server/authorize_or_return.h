#pragma once
// AUTHORIZE_OR_RETURN: the first line of a gRPC handler that needs `scope` (server/call_auth.h):
// answers the refusal, or declares `caller`. For the services' .cc files only; each has `auth_`.

#include "server/call_auth.h"
#include "server/proto_convert.h"  // ToGrpc

#define AUTHORIZE_OR_RETURN(context, scope)                                 \
  absl::StatusOr<Caller> caller_or = AuthorizeCall(context, *auth_, scope); \
  if (!caller_or.ok()) return ToGrpc(caller_or.status());                   \
  const Caller& caller = *caller_or
