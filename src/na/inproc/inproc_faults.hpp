// Fault injection for the inproc transport, for tests of the layers above na. Each function
// takes the inproc Transport to act on and fails with invalid_argument for any other transport.
#pragma once

#include "talaria/na/na.hpp"
#include "talaria/util/clock.hpp"
#include "talaria/util/result.hpp"

namespace talaria::na::inproc {

/// The next `n` messages sent from `t` are lost: their sends complete ok, nothing arrives.
Result<void> drop_next_messages(Transport& t, unsigned n);

/// Messages sent from `t` are delivered `delay` after they are posted (zero turns delaying
/// off; messages already delayed keep their time). A delayed send completes when it is
/// delivered, so it can be canceled until then; delivery happens in progress() on `t`, which
/// wakes for it (progress_fd() becomes readable when one is due). Order is kept.
Result<void> set_delivery_delay(Transport& t, Duration delay);

/// The next `n` operations posted on `t` (any kind) complete with `code` and do nothing else.
Result<void> fail_next_ops(Transport& t, Errc code, unsigned n = 1);

/// Break the link between `t` and `peer`, as if the connection dropped: on both sides the
/// pending operations that involve the other end (expected receives from it, delayed sends to
/// it) complete with disconnected. Later operations work again (a new "connection").
Result<void> disconnect(Transport& t, const Addr& peer);

}  // namespace talaria::na::inproc
