// Talaria: RPC and one-sided bulk transfers. The one header users include.
//
//   talaria::Engine server{"tcp://127.0.0.1:0", talaria::listen};
//   server.define("sum", [](int a, int b) { return a + b; });
//   talaria::Engine client{"tcp://"};
//   auto ep = client.lookup(server.self_address());
//   int sum = client.remote<int(int, int)>("sum").on(ep)(40, 2).get();
//
// Engine (engine.hpp), Procedure (procedure.hpp), Future (future.hpp), Task and sync_wait
// (task.hpp), Endpoint, Request, Bulk; version() (version.hpp). Errors: talaria::Exception, or
// the try_ twins that return Result<T>. docs/architecture.md explains the layers underneath.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include "talaria/api/config.hpp"
#include "talaria/api/define.hpp"
#include "talaria/api/endpoint.hpp"
#include "talaria/api/engine.hpp"
#include "talaria/api/error.hpp"
#include "talaria/api/executor.hpp"
#include "talaria/api/future.hpp"
#include "talaria/api/group.hpp"
#include "talaria/api/procedure.hpp"
#include "talaria/api/provider.hpp"
#include "talaria/api/signature.hpp"
#include "talaria/api/task.hpp"
#include "talaria/api/when.hpp"
#include "talaria/version.hpp"

#pragma GCC visibility pop
