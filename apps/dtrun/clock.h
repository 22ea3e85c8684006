#pragma once

#include "rendezvous/util/clock.h"

namespace dtrun::agent {

// The agent's cores take the one clock type of rendezvous/util/clock.h.
using dtrun::Clock;
using dtrun::TimePoint;
using SteadyClock = dtrun::SystemClock;

}  // namespace dtrun::agent
