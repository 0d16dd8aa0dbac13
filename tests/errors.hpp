// SPDX-License-Identifier: Apache-2.0
// The message of an expected exception, for tests that check what an error says.
#pragma once

#include <string>

namespace shardlib::test {

/// The message of the `E` that `f()` throws, or "no throw" when it returns (another exception
/// type propagates).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "no throw";
}

}  // namespace shardlib::test
